#!/usr/bin/env python3
"""Golden fixtures for the DeepSeek-V3 / Kimi K2 forward pass, produced by Hugging Face transformers.

Run on the GPU test host (it has torch + transformers; no network needed):
    python3 tools/make_golden_fixtures.py --out tests/fixtures/golden

For each case it
  1. draws random weights under the checkpoint's canonical tensor names (MODELS.md §1.2),
  2. writes the checkpoint mlaserve reads: config.json (saved by transformers' own config class) and
     safetensors in the stored dtype -- bf16, DeepSeek FP8 128x128 block-scaled, or compressed-tensors
     INT4 group-32 -- sharded with an index for some cases,
  3. loads the *dequantized* weights into transformers' DeepseekV3ForCausalLM in fp32 (eager
     attention, CPU, so no TF32), checking that no key is missing or unexpected,
  4. records logits at every position for prompts of several lengths and a 16-token greedy
     continuation (full recompute per step, no KV cache) with the top-1/top-2 margin of each step.

The reference is fp32 arithmetic on exactly the values the quantized checkpoint decodes to, so the
C++ engine can be held to fp32-level tolerances. Versions are recorded in each case's reference.json.
"""
import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.set_float32_matmul_precision("highest")

BASE = dict(
    vocab_size=384, hidden_size=96, intermediate_size=160, moe_intermediate_size=40,
    num_hidden_layers=3, num_attention_heads=12, num_key_value_heads=12, n_shared_experts=1,
    n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=48,
    qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=4, topk_group=2,
    num_experts_per_tok=3, first_k_dense_replace=1, norm_topk_prob=True, hidden_act="silu",
    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_theta=10000.0, attention_bias=False, bos_token_id=0, eos_token_id=1,
)

CASES = {
    # 12 heads (not a multiple of 16), q-LoRA, YaRN with mscale != mscale_all_dim, n_group > 1 with
    # topk_group < n_group, one dense layer then MoE; sharded checkpoint with an index.
    "ds_h12_yarn_group": dict(
        config=dict(max_position_embeddings=128,
                    rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=32,
                                      beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.8)),
        quant="bf16", shards=3, model_type="deepseek_v3"),
    # 20 heads, no q-LoRA (single q_proj), norm_topk_prob false, no rope scaling, two dense layers.
    "ds_h20_noqlora": dict(
        config=dict(num_attention_heads=20, num_key_value_heads=20, q_lora_rank=None,
                    norm_topk_prob=False, n_group=1, topk_group=1, first_k_dense_replace=2,
                    num_hidden_layers=3, rms_norm_eps=1e-5, routed_scaling_factor=1.5),
        quant="bf16", shards=1, model_type="deepseek_v3"),
    # DeepSeek FP8 block-scaled weights with dims that are not multiples of 128 (edge blocks).
    "ds_fp8_block": dict(
        config=dict(hidden_size=160, intermediate_size=288, moe_intermediate_size=80,
                    num_attention_heads=16, num_key_value_heads=16, q_lora_rank=96, kv_lora_rank=64,
                    qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_group=2, topk_group=1,
                    num_experts_per_tok=2, num_hidden_layers=2,
                    rope_scaling=dict(type="yarn", factor=8.0, original_max_position_embeddings=64,
                                      beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)),
        quant="fp8", shards=1, model_type="deepseek_v3"),
    # Kimi K2 Thinking style: compressed-tensors INT4 group-32 routed experts, K2 rope parameters.
    "k2_int4": dict(
        config=dict(hidden_size=128, intermediate_size=192, moe_intermediate_size=64,
                    num_attention_heads=8, num_key_value_heads=8, n_group=1, topk_group=1,
                    num_experts_per_tok=2, rms_norm_eps=1e-5, routed_scaling_factor=2.827,
                    rope_theta=50000.0, max_position_embeddings=256,
                    rope_scaling=dict(type="yarn", factor=8.0, original_max_position_embeddings=32,
                                      beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)),
        quant="int4", shards=2, model_type="kimi_k2"),
}

PROMPT_LENGTHS = [1, 5, 17, 64]
GREEDY_PROMPT_LENGTH = 9
GREEDY_STEPS = 16


def canonical_tensors(cfg, gen):
    """Random weights under the checkpoint names; shapes [out, in]. fp32 master copies."""
    H = cfg["num_attention_heads"]
    hid = cfg["hidden_size"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    r = cfg["kv_lora_rank"]
    qr = cfg["q_lora_rank"]

    def lin(out, inp, gain=1.0):
        return torch.randn(out, inp, generator=gen) * (gain / math.sqrt(inp))

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    t = {"model.embed_tokens.weight": torch.randn(cfg["vocab_size"], hid, generator=gen),
         "model.norm.weight": norm(hid),
         "lm_head.weight": lin(cfg["vocab_size"], hid, gain=3.0)}
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        t[p + "input_layernorm.weight"] = norm(hid)
        t[p + "post_attention_layernorm.weight"] = norm(hid)
        a = p + "self_attn."
        if qr is None:
            t[a + "q_proj.weight"] = lin(H * (dn + dr), hid)
        else:
            t[a + "q_a_proj.weight"] = lin(qr, hid)
            t[a + "q_a_layernorm.weight"] = norm(qr)
            t[a + "q_b_proj.weight"] = lin(H * (dn + dr), qr)
        t[a + "kv_a_proj_with_mqa.weight"] = lin(r + dr, hid)
        t[a + "kv_a_layernorm.weight"] = norm(r)
        t[a + "kv_b_proj.weight"] = lin(H * (dn + dv), r)
        t[a + "o_proj.weight"] = lin(hid, H * dv)
        m = p + "mlp."
        if L < cfg["first_k_dense_replace"]:
            I = cfg["intermediate_size"]
            t[m + "gate_proj.weight"] = lin(I, hid)
            t[m + "up_proj.weight"] = lin(I, hid)
            t[m + "down_proj.weight"] = lin(hid, I)
        else:
            E, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
            t[m + "gate.weight"] = lin(E, hid, gain=2.0)
            # Positive bias keeps every biased score > 0, where the DeepSeek (-inf) and HF (0.0)
            # group-masking rules agree; values are large enough to change some selections.
            t[m + "gate.e_score_correction_bias"] = 0.05 + 0.1 * torch.rand(E, generator=gen)
            for e in range(E):
                q = f"{m}experts.{e}."
                t[q + "gate_proj.weight"] = lin(I, hid)
                t[q + "up_proj.weight"] = lin(I, hid)
                t[q + "down_proj.weight"] = lin(hid, I)
            S = I * cfg["n_shared_experts"]
            t[m + "shared_experts.gate_proj.weight"] = lin(S, hid)
            t[m + "shared_experts.up_proj.weight"] = lin(S, hid)
            t[m + "shared_experts.down_proj.weight"] = lin(hid, S)
    return t


def is_fp8_target(name):
    # DeepSeek FP8: attention projections and all MLP linears; not embeddings, norms, lm_head, router.
    if not name.endswith(".weight") or "layernorm" in name or "norm.weight" in name:
        return False
    if name.startswith(("model.embed_tokens", "lm_head")) or ".mlp.gate.weight" in name:
        return False
    return ".self_attn." in name or ".mlp." in name


def is_int4_target(name):
    # Kimi K2 Thinking: only routed experts are int4.
    return ".mlp.experts." in name and name.endswith(".weight")


def quantize_fp8(w):
    out, inp = w.shape
    B = 128
    so, si = -(-out // B), -(-inp // B)
    pad = torch.zeros(so * B, si * B)
    pad[:out, :inp] = w
    blocks = pad.view(so, B, si, B)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = amax / 448.0
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[:, None, :, None]).view(so * B, si * B)[:out, :inp].contiguous()
    q = q.view(so * B, si * B)[:out, :inp].contiguous()
    return q, scale.float().contiguous(), deq


def quantize_int4(w):
    out, inp = w.shape
    assert inp % 32 == 0
    g = w.view(out, inp // 32, 32)
    scale = (g.abs().amax(dim=2) / 7.0).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.round(g / scale.float()[:, :, None]).clamp(-8, 7).to(torch.int64)
    # Dequantization multiplies in the scale dtype (bf16), as compressed-tensors does.
    deq = (q.to(torch.bfloat16) * scale[:, :, None]).float().view(out, inp)
    nib = (q.view(out, inp) + 8).numpy().astype(np.uint64)
    words = np.zeros((out, inp // 8), dtype=np.uint64)
    for j in range(8):
        words |= nib[:, j::8] << np.uint64(4 * j)
    packed = torch.from_numpy(words.astype(np.uint32).view(np.int32))
    return packed, scale, deq


def build_case(name, spec, out_root, seed):
    cfg = dict(BASE)
    cfg.update(spec["config"])
    gen = torch.Generator().manual_seed(seed)
    master = canonical_tensors(cfg, gen)

    ckpt = {}     # what mlaserve reads (stored dtypes)
    hf = {}       # what transformers gets (dequantized, fp32)
    for n, w in master.items():
        if n.endswith("e_score_correction_bias"):
            ckpt[n] = w.float()
            hf[n] = w.float()
        elif spec["quant"] == "fp8" and is_fp8_target(n):
            q, s, deq = quantize_fp8(w)
            ckpt[n] = q
            ckpt[n + "_scale_inv"] = s
            hf[n] = deq
        elif spec["quant"] == "int4" and is_int4_target(n):
            packed, s, deq = quantize_int4(w)
            base = n[: -len(".weight")]
            ckpt[base + ".weight_packed"] = packed
            ckpt[base + ".weight_scale"] = s
            ckpt[base + ".weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
            hf[n] = deq
        else:
            b = w.to(torch.bfloat16)
            ckpt[n] = b
            hf[n] = b.float()

    config = make_config(cfg)
    case_dir = os.path.join(out_root, name)
    shutil.rmtree(case_dir, ignore_errors=True)
    os.makedirs(case_dir)

    model, load_mode = load_reference_model(config, hf)
    print(f"{name}: transformers model loaded via {load_mode}")

    # Save mlaserve's checkpoint: transformers' own config.json, plus quantization_config.
    config.save_pretrained(case_dir)
    with open(os.path.join(case_dir, "config.json")) as f:
        cj = json.load(f)
    cj["model_type"] = spec["model_type"]
    cj["architectures"] = ["DeepseekV3ForCausalLM"]
    if spec["quant"] == "fp8":
        cj["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    elif spec["quant"] == "int4":
        cj["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                          "output_activations": None,
                                          "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                      "strategy": "group", "group_size": 32,
                                                      "dynamic": False, "actorder": None}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                       "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}
    with open(os.path.join(case_dir, "config.json"), "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
    write_checkpoint(ckpt, case_dir, spec["shards"])

    # Reference outputs.
    rng = np.random.default_rng(seed + 1000)
    ref = {}
    meta = {"case": name, "quant": spec["quant"], "model_type": spec["model_type"],
            "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": np.__version__, "dtype": "float32", "device": "cpu", "attn_implementation": "eager",
            "prompts": [], "greedy": {}}
    # Record what transformers actually used, so the C++ side can be checked against it.
    attn0 = model.model.layers[0].self_attn
    meta["hf_attention_scaling"] = float(attn0.scaling)
    rot = getattr(model.model, "rotary_emb", None)
    if rot is not None:
        meta["hf_attention_factor"] = float(getattr(rot, "attention_scaling", 1.0))
        meta["hf_inv_freq"] = [float(x) for x in rot.inv_freq.tolist()]
    if cfg["q_lora_rank"] is not None:
        meta["hf_q_a_layernorm_eps"] = float(attn0.q_a_layernorm.variance_epsilon)
    meta["hf_kv_a_layernorm_eps"] = float(attn0.kv_a_layernorm.variance_epsilon)
    meta["hf_rope_interleave"] = bool(getattr(config, "rope_interleave", True))
    with torch.no_grad():
        for i, L in enumerate(PROMPT_LENGTHS):
            ids = rng.integers(2, cfg["vocab_size"], size=L).astype(np.int32)
            logits = model(torch.from_numpy(ids.astype(np.int64))[None]).logits[0].float().numpy()
            ref[f"prompt_{i}"] = ids
            ref[f"logits_{i}"] = logits.astype(np.float32)
            meta["prompts"].append({"index": i, "length": L})
        ids = list(rng.integers(2, cfg["vocab_size"], size=GREEDY_PROMPT_LENGTH).astype(np.int64))
        prompt = list(ids)
        margins = []
        for _ in range(GREEDY_STEPS):
            last = model(torch.tensor(ids)[None]).logits[0, -1].float()
            top2 = torch.topk(last, 2)
            ids.append(int(top2.indices[0]))
            margins.append(float(top2.values[0] - top2.values[1]))
        ref["greedy_prompt"] = np.array(prompt, dtype=np.int32)
        ref["greedy_tokens"] = np.array(ids[len(prompt):], dtype=np.int32)
        ref["greedy_margins"] = np.array(margins, dtype=np.float32)
        meta["greedy"] = {"prompt_length": GREEDY_PROMPT_LENGTH, "steps": GREEDY_STEPS}
    np_save_file(ref, os.path.join(case_dir, "reference.safetensors"))
    with open(os.path.join(case_dir, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
    size = sum(os.path.getsize(os.path.join(case_dir, x)) for x in os.listdir(case_dir))
    print(f"{name}: {size / 1e3:.0f} kB, greedy margins min {min(margins):.3f}, "
          f"scaling {meta['hf_attention_scaling']:.6f}, attention_factor {meta.get('hf_attention_factor')}")


def make_config(cfg):
    """DeepseekV3Config from our keys; transformers >= 5 takes rope settings as `rope_parameters`."""
    cfg = dict(cfg)
    rs = cfg.pop("rope_scaling", None)
    theta = cfg.pop("rope_theta")
    if int(transformers.__version__.split(".")[0]) >= 5:
        rp = {"rope_type": "default", "rope_theta": theta}
        if rs:
            rp.update({k: v for k, v in rs.items() if k != "type"})
            rp["rope_type"] = rs["type"]
        config = DeepseekV3Config(rope_parameters=rp, **cfg)
    else:
        config = DeepseekV3Config(rope_scaling=rs, rope_theta=theta, **cfg)
    return config


def load_reference_model(config, hf):
    """Loads the dequantized fp32 weights into transformers' model; every key must match."""
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in hf.items()}, os.path.join(tmp, "model.safetensors"))
        model, info = DeepseekV3ForCausalLM.from_pretrained(
            tmp, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    mode = "from_pretrained"
    if problems:
        # Fall back to assigning parameters by hand (e.g. fused expert tensors); the checks below
        # still require every parameter assigned and every tensor used.
        print(f"from_pretrained reported {problems}; assigning parameters by hand", file=sys.stderr)
        model, mode = DeepseekV3ForCausalLM(config), "manual assignment"
        used = set()
        sd = model.state_dict()
        with torch.no_grad():
            for pname, param in sd.items():
                if pname in hf:
                    param.copy_(hf[pname]); used.add(pname); continue
                m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$", pname)
                if not m:
                    sys.exit(f"no source for parameter {pname} {tuple(param.shape)}")
                prefix, kind = m.groups()
                E = param.shape[0]
                if kind == "gate_up_proj":
                    per = [torch.cat([hf[f"{prefix}.{e}.gate_proj.weight"], hf[f"{prefix}.{e}.up_proj.weight"]], 0)
                           for e in range(E)]
                    names = [f"{prefix}.{e}.{w}_proj.weight" for e in range(E) for w in ("gate", "up")]
                else:
                    per = [hf[f"{prefix}.{e}.down_proj.weight"] for e in range(E)]
                    names = [f"{prefix}.{e}.down_proj.weight" for e in range(E)]
                stacked = torch.stack(per)
                if tuple(stacked.shape) != tuple(param.shape):
                    stacked = stacked.transpose(1, 2)
                assert tuple(stacked.shape) == tuple(param.shape), (pname, stacked.shape, param.shape)
                param.copy_(stacked); used.update(names)
        unused = set(hf) - used
        if unused:
            sys.exit(f"tensors not used by transformers: {sorted(unused)[:5]}")
    model = model.float().eval()
    return model, mode


def write_checkpoint(ckpt, case_dir, shards):
    names = sorted(ckpt)
    if shards == 1:
        save_file({n: ckpt[n].contiguous() for n in names}, os.path.join(case_dir, "model.safetensors"),
                  metadata={"format": "pt"})
        return
    groups = [names[i::shards] for i in range(shards)]
    weight_map, total = {}, 0
    for i, g in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: ckpt[n].contiguous() for n in g}, os.path.join(case_dir, fname), metadata={"format": "pt"})
        for n in g:
            weight_map[n] = fname
            total += ckpt[n].numel() * ckpt[n].element_size()
    with open(os.path.join(case_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    torch.manual_seed(0)
    for name in args.cases.split(","):
        build_case(name, CASES[name], args.out, seed=1234 + 17 * list(CASES).index(name))


if __name__ == "__main__":
    main()
