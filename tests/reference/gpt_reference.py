# PyTorch float64 reference for trident's GPT-2 golden test: weights, config and two batches in,
# logits, loss, every gradient and two AdamW steps out (docs/formats/tensor_file.md). Needs Debian's
# /usr/bin/python3 (python3-torch 1.13). Modes: --inputs IN.trtf --output OUT.trtf;
# --make-inputs IN.trtf [--vocab 50 --hidden 16 ...] (random tiny inputs); --self-test.
"""GPT-2 (pre-LN, Megatron parameter names, per-head interleaved qkv, tied output) in float64."""

import argparse
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensor_file import read_tensor_file, write_tensor_file  # noqa: E402

# Order of the entries of the "config" (i64) and "hyper" (f64) tensors.
CONFIG_KEYS = ["vocab", "vocab_padded", "hidden", "num_layers", "num_heads", "ffn_hidden",
               "seq_len", "max_positions", "batch"]
HYPER_KEYS = ["lr", "beta1", "beta2", "eps", "weight_decay", "clip_grad", "layernorm_eps"]

# ------------------------------------------------------------------------------------------------
# Parameters


def param_shapes(cfg):
    """[(name, shape)] for every parameter, in trident's canonical order."""
    C, F_, Vp = cfg["hidden"], cfg["ffn_hidden"], cfg["vocab_padded"]
    shapes = [("embedding.word_embeddings.weight", (Vp, C))]
    if not cfg.get("alibi", 0):
        shapes.append(("embedding.position_embeddings.weight", (cfg["max_positions"], C)))
    if cfg.get("embed_ln", 0):
        shapes += [("embedding.word_embeddings_layernorm.weight", (C,)),
                   ("embedding.word_embeddings_layernorm.bias", (C,))]
    for i in range(cfg["num_layers"]):
        p = f"layers.{i}."
        shapes += [(p + "input_layernorm.weight", (C,)), (p + "input_layernorm.bias", (C,)),
                   (p + "self_attention.query_key_value.weight", (3 * C, C)),
                   (p + "self_attention.query_key_value.bias", (3 * C,)),
                   (p + "self_attention.dense.weight", (C, C)),
                   (p + "self_attention.dense.bias", (C,)),
                   (p + "post_attention_layernorm.weight", (C,)),
                   (p + "post_attention_layernorm.bias", (C,)),
                   (p + "mlp.dense_h_to_4h.weight", (F_, C)), (p + "mlp.dense_h_to_4h.bias", (F_,)),
                   (p + "mlp.dense_4h_to_h.weight", (C, F_)), (p + "mlp.dense_4h_to_h.bias", (C,))]
    shapes += [("final_layernorm.weight", (C,)), ("final_layernorm.bias", (C,))]
    return shapes


def is_decayed(name):
    """Weight decay applies to embeddings and linear weights, not to biases or LayerNorm params."""
    return name.endswith(".weight") and "layernorm" not in name


def check_config(cfg):
    C, NH = cfg["hidden"], cfg["num_heads"]
    for key in CONFIG_KEYS:
        if cfg[key] <= 0:
            raise ValueError(f"config {key} = {cfg[key]} must be positive")
    if C % NH:
        raise ValueError(f"hidden ({C}) must be divisible by num_heads ({NH})")
    if cfg["vocab_padded"] < cfg["vocab"]:
        raise ValueError(f"vocab_padded ({cfg['vocab_padded']}) < vocab ({cfg['vocab']})")
    if cfg["seq_len"] > cfg["max_positions"]:
        raise ValueError(f"seq_len ({cfg['seq_len']}) > max_positions ({cfg['max_positions']})")


# ------------------------------------------------------------------------------------------------
# Model (B = batch, T = seq_len, C = hidden, NH = num_heads, HS = C / NH, F = ffn_hidden,
# V = vocab, Vp = vocab_padded)


def gelu_tanh(u):
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))


def alibi_slopes(n):
    """ALiBi slopes (Press et al.): geometric for a power of two; otherwise the closest power of
    two's slopes followed by every other slope of twice that many heads (BLOOM's rule)."""
    def pow2(m):
        return [2.0 ** (-8.0 * (i + 1) / m) for i in range(m)]
    closest = 2 ** int(math.floor(math.log2(n)))
    slopes = pow2(closest)
    if closest < n:
        slopes += pow2(2 * closest)[0::2][: n - closest]
    return torch.tensor(slopes, dtype=torch.float64)


def attention(a, p, prefix, NH, alibi=False):
    """Causal self-attention on a (B, T, C) -> (B, T, C), before the output projection. With ALiBi
    the scores get -slope_h * (query - key), the relative form (trident adds slope_h * key; the
    two differ by a per-row constant, which the softmax removes)."""
    B, T, C = a.shape
    HS = C // NH
    qkv = F.linear(a, p[prefix + "query_key_value.weight"], p[prefix + "query_key_value.bias"])
    # Megatron layout: the 3C outputs are grouped per head as [q_h | k_h | v_h], each HS wide.
    qkv = qkv.view(B, T, NH, 3, HS)
    q, k, v = (qkv[:, :, :, j, :].transpose(1, 2) for j in range(3))  # (B, NH, T, HS) each
    scores = q @ k.transpose(-1, -2) / math.sqrt(HS)  # (B, NH, T, T): [query, key]
    if alibi:
        pos = torch.arange(T, dtype=torch.float64)
        distance = pos[None, :] - pos[:, None]  # key - query (<= 0 where attended)
        scores = scores + alibi_slopes(NH)[:, None, None].to(scores.dtype) * distance
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # (B, NH, T, HS)
    return out.transpose(1, 2).reshape(B, T, C)  # channel h * HS + d


def gpt_forward(p, tokens, cfg, ln_eps):
    """Logits (B, T, Vp) for int tokens (B, T); p maps parameter names to tensors."""
    C = cfg["hidden"]
    T = tokens.shape[1]
    wte = p["embedding.word_embeddings.weight"]
    x = wte[tokens]
    if not cfg.get("alibi", 0):
        x = x + p["embedding.position_embeddings.weight"][:T]
    if cfg.get("embed_ln", 0):  # BLOOM: LayerNorm right after the word embedding
        x = F.layer_norm(x, (C,), p["embedding.word_embeddings_layernorm.weight"],
                         p["embedding.word_embeddings_layernorm.bias"], ln_eps)
    for i in range(cfg["num_layers"]):
        pre = f"layers.{i}."

        def ln(t, name):
            return F.layer_norm(t, (C,), p[pre + name + ".weight"], p[pre + name + ".bias"], ln_eps)

        a = ln(x, "input_layernorm")
        att = attention(a, p, pre + "self_attention.", cfg["num_heads"], cfg.get("alibi", 0))
        x = x + F.linear(att, p[pre + "self_attention.dense.weight"],
                         p[pre + "self_attention.dense.bias"])
        m = ln(x, "post_attention_layernorm")
        h = gelu_tanh(F.linear(m, p[pre + "mlp.dense_h_to_4h.weight"],
                               p[pre + "mlp.dense_h_to_4h.bias"]))
        x = x + F.linear(h, p[pre + "mlp.dense_4h_to_h.weight"], p[pre + "mlp.dense_4h_to_h.bias"])
    y = F.layer_norm(x, (C,), p["final_layernorm.weight"], p["final_layernorm.bias"], ln_eps)
    return y @ wte.t()  # tied output layer, all Vp columns


def gpt_loss(logits, labels, vocab):
    """Mean cross-entropy over all B*T positions; padding columns (>= vocab) are excluded."""
    return F.cross_entropy(logits[..., :vocab].reshape(-1, vocab), labels.reshape(-1))


# ------------------------------------------------------------------------------------------------
# Training steps


def read_inputs(inputs):
    """(cfg dict, hyper dict, params {name: f64 leaf}, batches [(tokens, labels)]) from IN."""
    cfg = dict(zip(CONFIG_KEYS, (int(v) for v in inputs["config"].tolist())))
    hyper = dict(zip(HYPER_KEYS, (float(v) for v in inputs["hyper"].tolist())))
    if len(cfg) != len(CONFIG_KEYS) or len(hyper) != len(HYPER_KEYS):
        raise ValueError(f"config needs {len(CONFIG_KEYS)} entries {CONFIG_KEYS}, hyper needs "
                         f"{len(HYPER_KEYS)} {HYPER_KEYS}")
    check_config(cfg)
    if "variant" in inputs:  # optional: [alibi, embed_layernorm] (BLOOM)
        cfg["alibi"], cfg["embed_ln"] = (int(v) for v in inputs["variant"].tolist())
    params = {}
    for name, shape in param_shapes(cfg):
        if name not in inputs:
            raise KeyError(f"input file lacks parameter '{name}'")
        t = inputs[name]
        if tuple(t.shape) != shape:
            raise ValueError(f"parameter '{name}' has shape {tuple(t.shape)}, expected {shape}")
        params[name] = t.to(torch.float64).clone().requires_grad_(True)
    batches = []
    for s in range(2):
        tokens, labels = inputs[f"tokens_{s}"].long(), inputs[f"labels_{s}"].long()
        want = (cfg["batch"], cfg["seq_len"])
        for what, t in (("tokens", tokens), ("labels", labels)):
            if tuple(t.shape) != want:
                raise ValueError(f"{what}_{s} has shape {tuple(t.shape)}, expected {want}")
            if t.numel() and (t.min() < 0 or t.max() >= cfg["vocab"]):
                raise ValueError(f"{what}_{s} holds ids outside [0, {cfg['vocab']})")
        batches.append((tokens, labels))
    return cfg, hyper, params, batches


def make_optimizer(params, hyper):
    decay = [t for n, t in params.items() if is_decayed(n)]
    no_decay = [t for n, t in params.items() if not is_decayed(n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": hyper["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=hyper["lr"], betas=(hyper["beta1"], hyper["beta2"]), eps=hyper["eps"])


def clip_gradients(params, clip_grad):
    """Global L2 norm of all gradients before clipping; scales them by
    clip_grad / (norm + 1e-6) when that is < 1 (torch's rule). clip_grad <= 0 disables clipping."""
    grads = [t.grad for t in params.values()]
    if clip_grad > 0:
        return torch.nn.utils.clip_grad_norm_(list(params.values()), clip_grad).detach()
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def run_reference(inputs):
    """Returns the OUT tensors (dict, in write order) for the IN tensors."""
    cfg, hyper, params, batches = read_inputs(inputs)
    ln_eps, V = hyper["layernorm_eps"], cfg["vocab"]
    opt = make_optimizer(params, hyper)
    out = {"config": inputs["config"], "hyper": inputs["hyper"]}

    tokens, labels = batches[0]
    logits = gpt_forward(params, tokens, cfg, ln_eps)
    loss = gpt_loss(logits, labels, V)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    out["logits"] = logits.detach()
    out["loss_0"] = loss.detach()
    for name, t in params.items():
        out["grad." + name] = t.grad.detach().clone()
    out["grad_norm_0"] = clip_gradients(params, hyper["clip_grad"])
    opt.step()
    for name, t in params.items():
        out["step1." + name] = t.detach().clone()

    tokens, labels = batches[1]
    opt.zero_grad(set_to_none=True)
    loss = gpt_loss(gpt_forward(params, tokens, cfg, ln_eps), labels, V)
    loss.backward()
    out["loss_1"] = loss.detach()
    out["grad_norm_1"] = clip_gradients(params, hyper["clip_grad"])
    opt.step()
    for name, t in params.items():
        out["step2." + name] = t.detach().clone()
    return {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------
# Input generation (tests and --self-test)


def make_inputs(cfg, hyper, seed, weight_std=0.02):
    """An IN dict with random weights: N(0, std) for weights and biases (residual projections
    std / sqrt(2 L)), LayerNorm weights 1 + N(0, 0.1) so every path carries gradient."""
    check_config(cfg)
    gen = torch.Generator().manual_seed(seed)
    out = {"config": torch.tensor([cfg[k] for k in CONFIG_KEYS], dtype=torch.int64),
           "hyper": torch.tensor([hyper[k] for k in HYPER_KEYS], dtype=torch.float64)}
    for s in range(2):
        for what in ("tokens", "labels"):
            out[f"{what}_{s}"] = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq_len"]),
                                               generator=gen, dtype=torch.int64).to(torch.int32)
    resid_std = weight_std / math.sqrt(2 * cfg["num_layers"])
    for name, shape in param_shapes(cfg):
        if "layernorm.weight" in name:
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name.endswith(("self_attention.dense.weight", "dense_4h_to_h.weight")):
            t = resid_std * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            t = weight_std * torch.randn(shape, generator=gen, dtype=torch.float64)
        out[name] = t.to(torch.float32)
    return out


# ------------------------------------------------------------------------------------------------
# Self-test: independent checks of the reference itself


def naive_logits(p, tokens, cfg, ln_eps):
    """The model written as scalar Python loops straight from the spec (tiny configs only)."""
    C, NH, L = cfg["hidden"], cfg["num_heads"], cfg["num_layers"]
    HS, F_, Vp = C // NH, cfg["ffn_hidden"], cfg["vocab_padded"]
    P = {n: t.detach().tolist() for n, t in p.items()}

    def linear(x, w, b):  # y[o] = sum_i x[i] W[o][i] + b[o]
        return [sum(x[i] * w[o][i] for i in range(len(x))) + b[o] for o in range(len(w))]

    def layernorm(x, w, b):
        mean = sum(x) / len(x)
        var = sum((xi - mean) ** 2 for xi in x) / len(x)
        return [(xi - mean) / math.sqrt(var + ln_eps) * w[i] + b[i] for i, xi in enumerate(x)]

    def gelu(u):
        return 0.5 * u * (1 + math.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))

    logits = []
    for seq in tokens.tolist():
        T = len(seq)
        xs = [[P["embedding.word_embeddings.weight"][tok][c] +
               P["embedding.position_embeddings.weight"][t][c] for c in range(C)]
              for t, tok in enumerate(seq)]
        for layer in range(L):
            pre = f"layers.{layer}."
            qkv = [linear(layernorm(x, P[pre + "input_layernorm.weight"],
                                    P[pre + "input_layernorm.bias"]),
                          P[pre + "self_attention.query_key_value.weight"],
                          P[pre + "self_attention.query_key_value.bias"]) for x in xs]
            att = [[0.0] * C for _ in range(T)]
            for h in range(NH):
                def part(t, j, h=h):  # j = 0 q, 1 k, 2 v of head h at position t
                    base = h * 3 * HS + j * HS
                    return qkv[t][base:base + HS]
                for t in range(T):
                    q = part(t, 0)
                    s = [sum(q[d] * part(u, 1)[d] for d in range(HS)) / math.sqrt(HS)
                         for u in range(t + 1)]
                    mx = max(s)
                    e = [math.exp(si - mx) for si in s]
                    z = sum(e)
                    for d in range(HS):
                        att[t][h * HS + d] = sum(e[u] / z * part(u, 2)[d] for u in range(t + 1))
            for t in range(T):
                proj = linear(att[t], P[pre + "self_attention.dense.weight"],
                              P[pre + "self_attention.dense.bias"])
                xs[t] = [xs[t][c] + proj[c] for c in range(C)]
                m = layernorm(xs[t], P[pre + "post_attention_layernorm.weight"],
                              P[pre + "post_attention_layernorm.bias"])
                hid = [gelu(u) for u in linear(m, P[pre + "mlp.dense_h_to_4h.weight"],
                                               P[pre + "mlp.dense_h_to_4h.bias"])]
                assert len(hid) == F_
                mlp = linear(hid, P[pre + "mlp.dense_4h_to_h.weight"],
                             P[pre + "mlp.dense_4h_to_h.bias"])
                xs[t] = [xs[t][c] + mlp[c] for c in range(C)]
        seq_logits = []
        for t in range(T):
            y = layernorm(xs[t], P["final_layernorm.weight"], P["final_layernorm.bias"])
            seq_logits.append(linear(y, P["embedding.word_embeddings.weight"], [0.0] * Vp))
        logits.append(seq_logits)
    return torch.tensor(logits, dtype=torch.float64)


def naive_adamw(params, grads_per_step, hyper):
    """Two decoupled-weight-decay Adam steps written out (torch 1.13's formula), with clipping."""
    lr, b1, b2, eps = hyper["lr"], hyper["beta1"], hyper["beta2"], hyper["eps"]
    p = {n: t.detach().clone() for n, t in params.items()}
    m = {n: torch.zeros_like(t) for n, t in p.items()}
    v = {n: torch.zeros_like(t) for n, t in p.items()}
    history = []
    for step, grad_fn in enumerate(grads_per_step, start=1):
        g = grad_fn(p)
        norm = math.sqrt(sum(float((gi ** 2).sum()) for gi in g.values()))
        scale = hyper["clip_grad"] / (norm + 1e-6)
        if hyper["clip_grad"] > 0 and scale < 1:
            g = {n: gi * scale for n, gi in g.items()}
        for n in p:
            wd = hyper["weight_decay"] if is_decayed(n) else 0.0
            p[n] = p[n] * (1 - lr * wd)
            m[n] = b1 * m[n] + (1 - b1) * g[n]
            v[n] = b2 * v[n] + (1 - b2) * g[n] ** 2
            denom = (v[n] / (1 - b2 ** step)).sqrt() + eps
            p[n] = p[n] - lr * (m[n] / (1 - b1 ** step)) / denom
        history.append((norm, {n: t.clone() for n, t in p.items()}))
    return history


# Note [Key bias gradient is zero]
# Adding a constant vector to every key of a head adds q.c to all scores of a query, which softmax
# ignores, so the key part of query_key_value.bias has gradient exactly zero in exact arithmetic.
# Computed gradients there are rounding noise (~1e-17 in f64, far larger in f32), and Adam turns
# noise into updates of up to ~lr (g / (sqrt(v) + eps) with g ~ eps), so compare those entries of
# step1/step2 loosely.
def key_bias_mask(cfg):
    """Bool (3C,) mask of the key entries of query_key_value.bias (per head: [q | k | v])."""
    HS = cfg["hidden"] // cfg["num_heads"]
    mask = torch.zeros(cfg["num_heads"], 3, HS, dtype=torch.bool)
    mask[:, 1, :] = True
    return mask.reshape(-1)


def max_rel_diff(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def self_test():
    torch.manual_seed(0)
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    tiny = dict(vocab=7, vocab_padded=8, hidden=4, num_layers=2, num_heads=2, ffn_hidden=8,
                seq_len=3, max_positions=5, batch=2)
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip_grad=1.0,
                 layernorm_eps=1e-5)

    # 1. Small random weights: the loss is close to ln(vocab).
    small = dict(vocab=97, vocab_padded=128, hidden=32, num_layers=2, num_heads=4, ffn_hidden=128,
                 seq_len=16, max_positions=32, batch=3)
    out = run_reference(make_inputs(small, hyper, seed=1))
    check(abs(float(out["loss_0"]) - math.log(97)) < 0.02,
          f"loss_0 {float(out['loss_0']):.5f} ~ ln(97) {math.log(97):.5f}")

    # 2. The vectorized model equals the spec written as scalar loops (layout, mask, tied head).
    inputs = make_inputs(tiny, hyper, seed=2, weight_std=0.5)
    cfg, _, params, batches = read_inputs(inputs)
    logits = gpt_forward(params, batches[0][0], cfg, hyper["layernorm_eps"]).detach()
    naive = naive_logits(params, batches[0][0], cfg, hyper["layernorm_eps"])
    check(max_rel_diff(logits, naive) < 1e-12,
          f"logits match the scalar-loop spec (rel diff {max_rel_diff(logits, naive):.2e})")
    lse = torch.logsumexp(naive[..., :cfg["vocab"]], dim=-1)
    picked = naive.gather(-1, batches[0][1].unsqueeze(-1)).squeeze(-1)
    naive_loss = float((lse - picked).mean())
    loss = float(gpt_loss(logits, batches[0][1], cfg["vocab"]))
    check(abs(loss - naive_loss) < 1e-12, f"loss {loss:.12f} excludes padding columns")

    # 3. Gradients against central finite differences (float64).
    names = list(params)

    def loss_of(*tensors):
        p = dict(zip(names, tensors))
        return gpt_loss(gpt_forward(p, batches[0][0], cfg, hyper["layernorm_eps"]),
                        batches[0][1], cfg["vocab"])

    leaves = tuple(params[n].detach().clone().requires_grad_(True) for n in names)
    ok = torch.autograd.gradcheck(loss_of, leaves, eps=1e-6, atol=1e-7, rtol=1e-5,
                                  raise_exception=False)
    check(ok, f"gradcheck over all {sum(t.numel() for t in leaves)} parameter elements")

    # 4. Full run (through a tensor file on disk) against hand-written AdamW + clipping.
    with tempfile.TemporaryDirectory() as tmp:
        in_path, out_path = os.path.join(tmp, "in.trtf"), os.path.join(tmp, "out.trtf")
        write_tensor_file(in_path, inputs)
        write_tensor_file(out_path, run_reference(read_tensor_file(in_path)))
        out = read_tensor_file(out_path)
    required = (["logits", "loss_0", "grad_norm_0", "loss_1", "grad_norm_1"] +
                [f"{k}.{n}" for k in ("grad", "step1", "step2") for n in names])
    check(all(k in out and out[k].dtype == torch.float64 for k in required),
          f"output holds all {len(required)} required f64 tensors")
    check(tuple(out["logits"].shape) == (2, 3, 8), "logits shape (B, T, Vp)")

    def grads_on(batch):
        def fn(p):
            leaves = {n: t.clone().requires_grad_(True) for n, t in p.items()}
            loss = gpt_loss(gpt_forward(leaves, batch[0], cfg, hyper["layernorm_eps"]), batch[1],
                            cfg["vocab"])
            return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
        return fn

    # See Note [Key bias gradient is zero]: those entries get noise-driven Adam updates.
    key_bias = {n: key_bias_mask(cfg) for n in names if n.endswith("query_key_value.bias")}
    kb_grad = max(float(out["grad." + n][m].abs().max()) for n, m in key_bias.items())
    check(kb_grad < 1e-15 * float(out["grad_norm_0"]),
          f"key part of qkv bias has zero gradient up to rounding (max |g| {kb_grad:.1e})")
    hist = naive_adamw(params, [grads_on(batches[0]), grads_on(batches[1])], hyper)
    check(float(out["grad_norm_0"]) > hyper["clip_grad"],
          f"step 0 clips (norm {float(out['grad_norm_0']):.4f} > {hyper['clip_grad']})")
    for s, (norm, p) in enumerate(hist):
        check(abs(norm - float(out[f"grad_norm_{s}"])) < 1e-12 * norm,
              f"grad_norm_{s} {norm:.10f} matches")
        worst, worst_kb = 0.0, 0.0
        for n in names:
            got, want = out[f"step{s + 1}.{n}"], p[n]
            if n in key_bias:
                worst_kb = max(worst_kb, float((got - want)[key_bias[n]].abs().max()))
                got, want = got[~key_bias[n]], want[~key_bias[n]]
            worst = max(worst, max_rel_diff(got, want))
        check(worst < 1e-12 and worst_kb < 1e-6 * hyper["lr"],
              f"step{s + 1} params match hand-written AdamW (rel diff {worst:.1e}; key bias "
              f"abs diff {worst_kb:.1e})")
    wpe = "embedding.position_embeddings.weight"
    unused = slice(cfg["seq_len"], None)
    check(bool((out["grad." + wpe][unused] == 0).all()) and
          bool((out["step1." + wpe][unused] != inputs[wpe][unused].double()).all()),
          "unused position rows: zero gradient, but weight decay still moves them")

    # 5. Tensor file errors.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "x.trtf")
        write_tensor_file(path, {"a": torch.arange(3, dtype=torch.int32)})
        good = open(path, "rb").read()
        bad = 0
        for variant in [b"X" + good[1:]] + [good[:n] for n in range(len(good))] + [good + b"\0"]:
            with open(path, "wb") as f:
                f.write(variant)
            try:
                read_tensor_file(path)
            except ValueError:
                bad += 1
        check(bad == len(good) + 2, f"tensor_file.py rejects bad magic, every truncation, trailing "
              f"bytes ({bad}/{len(good) + 2})")

    print("self-test " + ("FAILED: " + "; ".join(failures) if failures else "passed"))
    return 1 if failures else 0


# ------------------------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--inputs", help="IN tensor file (config, hyper, batches, parameters)")
    mode.add_argument("--make-inputs", metavar="PATH",
                      help="write a random IN file for the config flags below and exit")
    mode.add_argument("--self-test", action="store_true", help="check this script, then exit")
    ap.add_argument("--output", help="OUT tensor file (with --inputs)")
    defaults = dict(vocab=50, vocab_padded=64, hidden=16, num_layers=2, num_heads=4, ffn_hidden=64,
                    seq_len=8, max_positions=16, batch=2)
    for key in CONFIG_KEYS:
        ap.add_argument("--" + key.replace("_", "-"), type=int, default=defaults[key])
    hyper_defaults = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                          clip_grad=1.0, layernorm_eps=1e-5)
    for key in HYPER_KEYS:
        ap.add_argument("--" + key.replace("_", "-"), type=float, default=hyper_defaults[key])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--weight-std", type=float, default=0.02)
    args = ap.parse_args(argv)
    if args.inputs and not args.output:
        ap.error("--inputs needs --output")
    return args


def main(argv):
    args = parse_args(argv)
    if args.self_test:
        return self_test()
    if args.make_inputs:
        cfg = {k: getattr(args, k) for k in CONFIG_KEYS}
        hyper = {k: getattr(args, k) for k in HYPER_KEYS}
        write_tensor_file(args.make_inputs, make_inputs(cfg, hyper, args.seed, args.weight_std))
        return 0
    out = run_reference(read_tensor_file(args.inputs))
    write_tensor_file(args.output, out)
    print(f"loss_0 {float(out['loss_0']):.10f} grad_norm_0 {float(out['grad_norm_0']):.6g} "
          f"loss_1 {float(out['loss_1']):.10f} grad_norm_1 {float(out['grad_norm_1']):.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
