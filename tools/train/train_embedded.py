#!/usr/bin/env python3
"""Trains mlaserve's embedded default model and its draft, from the corpus made by make_corpus.py.

Run on the GPU host (torch, transformers, tokenizers, tiktoken are there; no network needed):
    python3 tools/train/train_embedded.py all --corpus CORPUS_DIR --work WORK_DIR --out models
Stages (each skips work whose outputs exist, so a rerun resumes where the last one stopped):
  tokenizer  byte-level BPE (HF tokenizers' trainer for the merges), written as Kimi's tiktoken.model
             layout: 3840 ranks + 256 special slots = 4096 ids
  encode     tokenizes train/heldout with tiktoken using the same ranks and the same pre-tokenization
             regex as mlaserve's "kimi" pattern, so training ids are exactly what mlaserve produces
  train      DeepseekV3ForCausalLM from scratch (main, then draft), bf16 autocast, AdamW, cosine LR,
             a wall-clock budget per run (--minutes), checkpoints every 200 steps (resumable), the
             checkpoint with the lowest held-out loss kept
  export     HF layout: config.json + model.safetensors (bf16) + tokenizer files, into --out/{default,draft}
  eval       held-out perplexity (the same windowing as `mlaserve perplexity`) and greedy continuations
             of fixed prompts, in fp32 on the exported bf16 weights; written to --out/<model>/reference.json
"""
import argparse
import base64
import json
import math
import os
import sys
import time

import numpy as np
import torch

# mlaserve's "kimi" pre-tokenization pattern (src/tokenizer/pretokenizer.cpp), in the lookahead form that
# PCRE2 and tiktoken's fancy-regex both accept.
UPPER = r"(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])"
LOWER = r"(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])"
KIMI_PATTERN = (r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?" + UPPER + "*" + LOWER + r"+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                + r"|[^\r\n\p{L}\p{N}]?" + UPPER + "+" + LOWER + r"*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
NUM_RANKS = 3840          # BPE tokens (256 single bytes + 3584 merges)
VOCAB = NUM_RANKS + 256   # plus Kimi-style special slots
SPECIALS = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"]
BOS, EOS = NUM_RANKS, NUM_RANKS + 1
CHAT_TEMPLATE = ("{%- for message in messages -%}<|im_{{ message.role }}|>{{ message.role }}<|im_middle|>"
                 "{{ message.content }}<|im_end|>{%- endfor -%}{%- if add_generation_prompt -%}"
                 "<|im_assistant|>assistant<|im_middle|>{%- endif -%}")
SEQ = 512                 # training context and the perplexity window
PROMPTS = ["In the beginning", "The Python interpreter", "Blessed are the", "A dictionary is",
           "The earth was formless and", "dog: a domesticated"]

# Sizes chosen for the 12 MB budget (bf16): main ~4.3M parameters, draft ~1.3M.
MODELS = {
    "default": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_hidden_layers=4,
                    first_k_dense_replace=1, num_attention_heads=4, q_lora_rank=128, kv_lora_rank=64,
                    qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=8,
                    num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1),
    "draft": dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
                  first_k_dense_replace=1, num_attention_heads=2, q_lora_rank=64, kv_lora_rank=32,
                  qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=4,
                  num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1),
}
# The size sweep (issue #7: "sizes that give the lowest held-out loss within the size budget"). Each
# stays under the 12 MB total with the draft and tokenizer files (main model <= ~4.58M parameters in
# bf16): deeper-narrower, one more layer with fewer experts, and so on. `--models` picks which to run;
# runs of different names share --work (tokenizer, encoded corpus) and can run concurrently.
_BASE = MODELS["default"]
SWEEP = {
    "h192_l7": dict(_BASE, hidden_size=192, num_hidden_layers=7, q_lora_rank=96),
    "h224_l5": dict(_BASE, hidden_size=224, num_hidden_layers=5, q_lora_rank=112),
    "h256_l5_e6": dict(_BASE, num_hidden_layers=5, n_routed_experts=6, n_group=2, topk_group=1),
    "h160_l8": dict(_BASE, hidden_size=160, num_hidden_layers=8, q_lora_rank=80, intermediate_size=480),
}
MODELS.update(SWEEP)


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ------------------------------------------------------------------------------------------ tokenizer
def stage_tokenizer(args):
    out = os.path.join(args.work, "tiktoken.model")
    if os.path.exists(out):
        return
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(KIMI_PATTERN.replace("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'s|'t|'re|'ve|'m|'ll|'d)")),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=NUM_RANKS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=[])
    tok.train([os.path.join(args.corpus, "train.txt")], trainer)
    # ByteLevel maps bytes to printable characters; invert it to get each token's bytes.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    unbyte = {chr(c): b for b, c in zip(bs, cs)}
    vocab = tok.get_vocab()
    assert len(vocab) == NUM_RANKS, f"trainer made {len(vocab)} tokens, want {NUM_RANKS}"
    # Rank = the trainer's id: single bytes first, then merges in the order they were learned, which is
    # the priority tiktoken's merge loop needs (lowest rank merges first).
    items = sorted(vocab.items(), key=lambda kv: kv[1])
    with open(out, "w") as f:
        for token, rank in items:
            f.write(base64.b64encode(bytes(unbyte[c] for c in token)).decode() + f" {rank}\n")
    log(f"tokenizer: {len(items)} ranks -> {out}")


def load_encoding(work):
    import tiktoken
    ranks = {}
    for line in open(os.path.join(work, "tiktoken.model")):
        tok, rank = line.split()
        ranks[base64.b64decode(tok)] = int(rank)
    specials = {name: NUM_RANKS + i for i, name in enumerate(special_names())}
    return tiktoken.Encoding("mlaserve-embedded", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def special_names():
    return SPECIALS + [f"<|reserved_token_{i}|>" for i in range(len(SPECIALS), 256)]


def stage_encode(args):
    enc = None
    for split in ("train", "heldout"):
        out = os.path.join(args.work, f"{split}.u16")
        if os.path.exists(out):
            continue
        enc = enc or load_encoding(args.work)
        text = open(os.path.join(args.corpus, f"{split}.txt"), encoding="utf-8").read()
        docs = text.split("\n\n")
        ids = []
        for batch in range(0, len(docs), 4096):
            for d in enc.encode_ordinary_batch(docs[batch:batch + 4096]):
                ids.extend(d)
                ids.append(EOS)  # documents are separated by [EOS] in the token stream
        np.asarray(ids, dtype=np.uint16).tofile(out)
        log(f"encode {split}: {len(text) / 1e6:.2f} MB -> {len(ids)} tokens ({len(text) / len(ids):.2f} bytes/token)")


# ------------------------------------------------------------------------------------------- training
def make_config(name):
    from transformers import DeepseekV3Config
    c = dict(MODELS[name])
    return DeepseekV3Config(vocab_size=VOCAB, num_key_value_heads=c["num_attention_heads"], hidden_act="silu",
                            max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0,
                            routed_scaling_factor=1.0, norm_topk_prob=True, tie_word_embeddings=False,
                            attention_bias=False, bos_token_id=BOS, eos_token_id=EOS, initializer_range=0.02,
                            **c)


def batches(data, batch, rng):
    starts = rng.integers(0, len(data) - SEQ - 1, size=batch)
    x = np.stack([data[s:s + SEQ + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(x).cuda(non_blocking=True)


@torch.no_grad()
def heldout_loss(model, data, max_windows=64):
    model.eval()
    n = min(max_windows, (len(data) - 1) // SEQ)
    total, count = 0.0, 0
    for i in range(0, n, 16):
        w = torch.from_numpy(np.stack([data[j * SEQ:j * SEQ + SEQ + 1] for j in range(i, min(n, i + 16))])
                             .astype(np.int64)).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(w[:, :-1]).logits.float()
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), w[:, 1:].reshape(-1),
                                                   reduction="sum").item()
        count += w[:, 1:].numel()
    model.train()
    return total / count


def stage_train(args, name):
    from transformers import DeepseekV3ForCausalLM
    best_path = os.path.join(args.work, f"{name}_best.pt")
    done_flag = os.path.join(args.work, f"{name}_done")
    if os.path.exists(done_flag):
        return
    train = np.fromfile(os.path.join(args.work, "train.u16"), dtype=np.uint16)
    held = np.fromfile(os.path.join(args.work, "heldout.u16"), dtype=np.uint16)
    torch.manual_seed(1234)
    model = DeepseekV3ForCausalLM(make_config(name)).cuda()
    params = sum(p.numel() for p in model.parameters())
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    steps = args.draft_steps if name == "draft" else args.steps
    state = {"step": 0, "best": float("inf"), "curve": []}
    ckpt = os.path.join(args.work, f"{name}_ckpt.pt")
    if os.path.exists(ckpt):
        saved = torch.load(ckpt, map_location="cuda", weights_only=False)
        model.load_state_dict(saved["model"]); opt.load_state_dict(saved["opt"]); state = saved["state"]
        log(f"{name}: resumed at step {state['step']}")
    rng = np.random.default_rng(1000 + state["step"])
    log(f"{name}: {params / 1e6:.2f}M parameters, {len(train)} train tokens, {steps} steps of {args.batch}x{SEQ}")
    budget = (args.draft_minutes if name == "draft" else args.minutes) * 60
    t0 = time.time()
    model.train()
    # The schedule length is fixed once, from the speed of the first 30 steps and the wall-clock budget,
    # and stored in the checkpoint so that a resumed run follows the same schedule.
    calib_t = None
    while state["step"] < state.get("planned", steps) and time.time() - t0 < budget:
        s = state["step"]
        if "planned" not in state:
            if s == 10:
                torch.cuda.synchronize(); calib_t = time.time()
            elif s == 40:
                torch.cuda.synchronize()
                per_step = (time.time() - calib_t) / 30 * 1.08  # + held-out evaluations
                state["planned"] = max(200, min(steps, int((budget - (time.time() - t0)) / per_step) + s))
                log(f"{name}: {per_step * 1e3:.0f} ms/step -> schedule of {state['planned']} steps")
        total = state.get("planned", steps)
        lr = args.lr * min(1.0, (s + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batches(train, args.batch, rng)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] = s + 1
        if state["step"] % 200 == 0 or state["step"] == state.get("planned", steps):
            hl = heldout_loss(model, held)
            state["curve"].append({"step": state["step"], "train_loss": round(loss.item(), 4),
                                   "heldout_loss": round(hl, 4), "seconds": round(time.time() - t0, 1)})
            log(f"{name} step {state['step']}: train {loss.item():.4f} heldout {hl:.4f} lr {lr:.2e}")
            if hl < state["best"]:
                state["best"] = hl
                torch.save(model.state_dict(), best_path)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, ckpt)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, ckpt)
    with open(os.path.join(args.work, f"{name}_curve.json"), "w") as f:
        json.dump(state["curve"], f, indent=1)
    if state["step"] >= state.get("planned", steps):
        open(done_flag, "w").write("done\n")
    log(f"{name}: stopped at step {state['step']} of {steps}; best held-out loss {state['best']:.4f}")


# --------------------------------------------------------------------------------------------- export
def write_tokenizer_files(work, out):
    import shutil
    shutil.copy(os.path.join(work, "tiktoken.model"), os.path.join(out, "tiktoken.model"))
    added = {str(NUM_RANKS + i): {"content": s, "special": True} for i, s in enumerate(special_names())}
    cfg = {"tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
           "added_tokens_decoder": added, "chat_template": CHAT_TEMPLATE}
    json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    json.dump({"bos_token_id": BOS, "eos_token_id": [EOS, NUM_RANKS + 2]},
              open(os.path.join(out, "generation_config.json"), "w"), indent=2)


def stage_export(args, name):
    from transformers import DeepseekV3ForCausalLM
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    model = DeepseekV3ForCausalLM(make_config(name))
    model.load_state_dict(torch.load(os.path.join(args.work, f"{name}_best.pt"), map_location="cpu"))
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    write_tokenizer_files(args.work, out)
    curve = os.path.join(args.work, f"{name}_curve.json")
    if os.path.exists(curve):
        import shutil
        shutil.copy(curve, os.path.join(out, "training_curve.json"))
    log(f"export {name}: {sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)) / 1e6:.2f} MB -> {out}")


# ----------------------------------------------------------------------------------------------- eval
def perplexity_windows(ids):
    """The definition `mlaserve perplexity` implements: [BOS] + ids, cut into windows of SEQ + 1 tokens
    that overlap by one, so every token after [BOS] is predicted exactly once with at most SEQ tokens of
    context; perplexity = exp(total NLL / predicted tokens)."""
    seq = [BOS] + list(ids)
    return [seq[i:i + SEQ + 1] for i in range(0, len(seq) - 1, SEQ)]


@torch.no_grad()
def stage_eval(args, name):
    from transformers import DeepseekV3ForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    out = os.path.join(args.out, name)
    model = DeepseekV3ForCausalLM.from_pretrained(out, dtype=torch.float32).cuda().eval()
    enc = load_encoding(args.work)
    text = open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8").read()
    slices = {"heldout": text, "heldout_head_4k": text[:4096]}
    ppl = {}
    for key, t in slices.items():
        ids = enc.encode_ordinary(t)
        nll, count = 0.0, 0
        for w in perplexity_windows(ids):
            x = torch.tensor([w], device="cuda")
            logits = model(x[:, :-1]).logits[0].double()
            nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            count += len(w) - 1
        ppl[key] = {"tokens": count, "bytes": len(t.encode()), "perplexity": math.exp(nll / count),
                    "mean_nll": nll / count}
        log(f"eval {name} {key}: {count} tokens, perplexity {math.exp(nll / count):.4f}")
    greedy = []
    for p in PROMPTS:
        ids = [BOS] + enc.encode_ordinary(p)
        gen, margins = [], []
        for _ in range(24):
            logits = model(torch.tensor([ids + gen], device="cuda")).logits[0, -1].double()
            top = torch.topk(logits, 2)
            gen.append(int(top.indices[0])); margins.append(float(top.values[0] - top.values[1]))
        greedy.append({"prompt": p, "prompt_ids": ids, "greedy_ids": gen, "min_margin": min(margins),
                       "text": enc.decode(gen)})
        log(f"greedy {name} {p!r} -> {enc.decode(gen)!r} (min margin {min(margins):.3g})")
    import transformers
    ref = {"torch": torch.__version__, "transformers": transformers.__version__, "window": SEQ,
           "perplexity": ppl, "greedy": greedy, "definition": perplexity_windows.__doc__.strip()}
    json.dump(ref, open(os.path.join(out, "reference.json"), "w"), indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=["tokenizer", "encode", "train", "export", "eval", "all"])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", default="models")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--draft-steps", type=int, default=1500)
    ap.add_argument("--minutes", type=float, default=5.5)
    ap.add_argument("--draft-minutes", type=float, default=1.5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--models", default="default,draft", help=f"comma list of {', '.join(MODELS)}")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    s = args.stage
    if s in ("tokenizer", "all"): stage_tokenizer(args)
    if s in ("encode", "all"): stage_encode(args)
    for name in args.models.split(","):
        if name not in MODELS:
            ap.error(f"--models: unknown {name!r}")
        if s in ("train", "all"): stage_train(args, name)
        if s in ("export", "all"): stage_export(args, name)
        if s in ("eval", "all"): stage_eval(args, name)


if __name__ == "__main__":
    main()
