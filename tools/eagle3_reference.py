#!/usr/bin/env python3
"""An EAGLE-3 draft checkpoint plus a PyTorch reference of its draft steps, for tests/model/test_eagle3.cpp.

Run where torch is installed (the GPU test host; CPU is enough):
    python3 tools/eagle3_reference.py --out /tmp/eagle3_ref
    MLA_EAGLE3_REFERENCE=/tmp/eagle3_ref build/cuda/tests/mlaserve_tests --gtest_filter='Eagle3.MatchesPyTorch*'
The committed copy the test reads by default is tests/fixtures/eagle3_ref (written on the H200 host,
torch 2.11, by the command above).

It writes, independently of the C++ writer, a random draft in the SpecForge / sglang layout
(LlamaForCausalLMEagle3: fc, midlayer.*, norm, lm_head, d2t int64, t2d bool, embed_tokens) for the
tiny preset target (vocab 512, hidden 128, 4 layers), then computes in fp32 on the CPU, with plain
torch ops written from the sglang model (MODELS.md §4):
  1. a prefill of N rows fed by random target features (cache positions 0..N-1, causal attention),
  2. one chained row at position N fed by the last prefill row's output (pre-norm hidden state),
and saves the inputs, the logits over the target vocabulary (-inf outside the d2t image) and the
hidden outputs to reference.safetensors beside the checkpoint.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

VOCAB, HIDDEN, TARGET_LAYERS = 512, 128, 4  # the tiny preset target (src/io/presets.cpp)
HEADS, KV_HEADS, HEAD_DIM, INTER = 8, 2, 32, 192
DRAFT_VOCAB, AUX = 160, [1, 2, 3]
EPS, THETA, N = 1e-5, 10000.0, 13


def rms_norm(x, w):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + EPS))


def rope(x, pos):  # x [T, heads, D]; Llama rotate_half layout
    inv = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.int64).float() / HEAD_DIM))
    ang = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def draft_step(w, tokens, pos, h, k_cache, v_cache):
    """One draft step over rows `tokens` at positions `pos`; k_cache/v_cache hold earlier positions."""
    e = w["embed_tokens.weight"][tokens]
    x = torch.cat([rms_norm(e, w["midlayer.input_layernorm.weight"]),  # embedding first
                   rms_norm(h, w["midlayer.hidden_norm.weight"])], -1)
    T = x.shape[0]
    q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(T, HEADS, HEAD_DIM)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(T, KV_HEADS, HEAD_DIM)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(T, KV_HEADS, HEAD_DIM)
    q, k = rope(q, pos), rope(k, pos)
    K, V = torch.cat([k_cache, k]), torch.cat([v_cache, v])
    rep = HEADS // KV_HEADS
    Kr, Vr = K.repeat_interleave(rep, dim=1), V.repeat_interleave(rep, dim=1)  # head h reads kv head h // rep
    scores = torch.einsum("thd,jhd->htj", q, Kr) / HEAD_DIM ** 0.5
    key_pos = torch.arange(K.shape[0])
    scores = scores.masked_fill(key_pos[None, None, :] > pos[None, :, None], float("-inf"))
    o = torch.einsum("htj,jhd->thd", scores.softmax(-1), Vr).reshape(T, HEADS * HEAD_DIM)
    r = o @ w["midlayer.self_attn.o_proj.weight"].T + h
    xn = rms_norm(r, w["midlayer.post_attention_layernorm.weight"])
    gate, up = xn @ w["midlayer.mlp.gate_proj.weight"].T, xn @ w["midlayer.mlp.up_proj.weight"].T
    out = (torch.nn.functional.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T + r
    draft_logits = rms_norm(out, w["norm.weight"]) @ w["lm_head.weight"].T
    logits = torch.full((T, VOCAB), float("-inf"))
    logits[:, torch.arange(DRAFT_VOCAB) + w["d2t"]] = draft_logits
    return logits, out, K, V


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)

    def randn(*shape, std=1.0, mean=0.0):
        return (mean + std * torch.randn(*shape, generator=g)).to(torch.bfloat16)

    w = {"embed_tokens.weight": randn(VOCAB, HIDDEN)}
    for name, (o, i) in {"fc": (HIDDEN, 3 * HIDDEN), "midlayer.self_attn.q_proj": (HEADS * HEAD_DIM, 2 * HIDDEN),
                         "midlayer.self_attn.k_proj": (KV_HEADS * HEAD_DIM, 2 * HIDDEN),
                         "midlayer.self_attn.v_proj": (KV_HEADS * HEAD_DIM, 2 * HIDDEN),
                         "midlayer.self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
                         "midlayer.mlp.gate_proj": (INTER, HIDDEN), "midlayer.mlp.up_proj": (INTER, HIDDEN),
                         "midlayer.mlp.down_proj": (HIDDEN, INTER), "lm_head": (DRAFT_VOCAB, HIDDEN)}.items():
        w[name + ".weight"] = randn(o, i, std=(3.0 if name == "lm_head" else 1.0) / i ** 0.5)
    for name in ["midlayer.input_layernorm", "midlayer.hidden_norm", "midlayer.post_attention_layernorm", "norm"]:
        w[name + ".weight"] = randn(HIDDEN, std=0.1, mean=1.0)
    ids = torch.cat([torch.arange(64), 64 + torch.randperm(VOCAB - 64, generator=g)[: DRAFT_VOCAB - 64]]).sort().values
    d2t = ids - torch.arange(DRAFT_VOCAB)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    save_file({**w, "d2t": d2t, "t2d": t2d}, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    config = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_size=HIDDEN,
                  intermediate_size=INTER, num_hidden_layers=1, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_act="silu", rms_norm_eps=EPS,
                  rope_theta=THETA, rope_scaling=None, max_position_embeddings=1024, vocab_size=VOCAB,
                  draft_vocab_size=DRAFT_VOCAB, tie_word_embeddings=False, torch_dtype="bfloat16",
                  eagle_config=dict(eagle_aux_hidden_state_layer_ids=AUX, use_aux_hidden_state=True))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    wf = {k: (v.float() if v.is_floating_point() else v) for k, v in w.items()}
    wf["d2t"] = d2t
    tokens = torch.randint(0, VOCAB, (N + 1,), generator=g)
    features = torch.rand(N, 3 * HIDDEN, generator=g) * 2 - 1
    empty = torch.zeros(0, KV_HEADS, HEAD_DIM)
    with torch.no_grad():
        h = features @ wf["fc.weight"].T
        logits, hidden, K, V = draft_step(wf, tokens[:N], torch.arange(N), h, empty, empty)
        logits2, hidden2, _, _ = draft_step(wf, tokens[N:], torch.tensor([N]), hidden[-1:], K, V)
    save_file({"tokens": tokens.to(torch.int32), "features": features.contiguous(),
               "prefill_logits": logits.contiguous(), "prefill_hidden": hidden.contiguous(),
               "chained_logits": logits2.contiguous(), "chained_hidden": hidden2.contiguous()},
              os.path.join(args.out, "reference.safetensors"), metadata={"torch": torch.__version__})
    print(f"wrote {args.out}: draft + reference ({N} prefill rows, 1 chained row)")


if __name__ == "__main__":
    main()
