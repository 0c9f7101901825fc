# PyTorch baseline for trident's end-to-end step benchmark: one GPT-2 training step (forward + loss,
# zero_grad, backward, AdamW) timed the way /work/shared/reference/cpu-baselines.md §2 did it.
# Prints one JSON line. Run with Debian's /usr/bin/python3 (python3-torch 1.13), or with the
# current PyTorch of bench/setup-peer-venv (/opt/trident-bench-venv/bin/python, PyTorch 2.15:
# scaled_dot_product_attention, fused AdamW, --compile for torch.compile), e.g.
#   /usr/bin/python3 bench/e2e/torch_gpt_step.py --num-layers 12 --hidden-size 768 \
#       --num-attention-heads 12 --vocab-size 50257 --micro-batch-size 4 --seq-length 64 --threads 2
"""Time full GPT-2 training steps in PyTorch (fp32, or bf16 autocast around forward and loss)."""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-layers", type=int, default=12)
    ap.add_argument("--hidden-size", type=int, default=768)
    ap.add_argument("--num-attention-heads", type=int, default=12)
    ap.add_argument("--vocab-size", type=int, default=50257)
    ap.add_argument("--max-position-embeddings", type=int, default=1024)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--seq-length", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="bf16 = torch.autocast('cpu', bfloat16) around forward and loss; "
                         "fp32 master weights and AdamW either way")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (PyTorch >= 2; inductor's C++ CPU code)")
    ap.add_argument("--fused-adamw", choices=["auto", "on", "off"], default="auto",
                    help="AdamW(fused=True): auto = on where the PyTorch has it (>= 2.4)")
    ap.add_argument("--attention", choices=["auto", "sdpa", "manual"], default="auto",
                    help="sdpa = F.scaled_dot_product_attention(is_causal=True); auto = sdpa where "
                         "the PyTorch has it (>= 2.0), else the manual masked softmax")
    ap.add_argument("--hidden-dropout", type=float, default=0.0,
                    help="dropout after the embedding and on both residual branches (Megatron's)")
    ap.add_argument("--attention-dropout", type=float, default=0.0,
                    help="dropout of the attention probabilities")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--passive", action="store_true",
                    help="set OMP_WAIT_POLICY=PASSIVE (idle OpenMP workers sleep instead of spin)")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                    help="before timing, wait up to S seconds for the machine to be idle "
                         "(< 0.10 cores busy over 4 s); the JSON says whether it was")
    ap.add_argument("--max-foreign-cores", type=float, default=None, metavar="X",
                    help="redo the timed steps (up to --attempts times) if other processes used "
                         "more than X cores on average while they ran")
    ap.add_argument("--attempts", type=int, default=3)
    args = ap.parse_args(argv)
    if args.hidden_size % args.num_attention_heads:
        ap.error("--hidden-size must be divisible by --num-attention-heads")
    if args.seq_length > args.max_position_embeddings:
        ap.error("--seq-length exceeds --max-position-embeddings")
    if args.steps < 1 or args.warmup < 0:
        ap.error("need --steps >= 1 and --warmup >= 0")
    return args


# ------------------------------------------------------------------------------------------------
# Load accounting: other jobs share this machine's 2 cores (cpu-baselines.md §0), so every run
# measures how much CPU other processes took while it was timed.


def busy_cpu_s():
    """Busy CPU seconds of the whole machine (user..steal, without idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class LoadMeter:
    """CPU cores used by other processes between start() and stop()."""

    def start(self):
        self.t, self.busy, self.own = time.perf_counter(), busy_cpu_s(), own_cpu_s()

    def stop(self):
        wall = time.perf_counter() - self.t
        foreign = (busy_cpu_s() - self.busy) - (own_cpu_s() - self.own)
        return max(foreign, 0.0) / max(wall, 1e-9)


def wait_until_idle(max_wait_s, threshold=0.10, window_s=4.0):
    """True once the machine used < threshold cores over a window; False after max_wait_s."""
    deadline = time.monotonic() + max_wait_s
    while True:
        meter = LoadMeter()
        meter.start()
        time.sleep(window_s)
        if meter.stop() < threshold:
            return True
        if time.monotonic() >= deadline:
            return False


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


# ------------------------------------------------------------------------------------------------
# Model: nanoGPT-like GPT-2 (pre-LN, learned positions, tanh GELU, biases, tied output layer),
# standard [q | k | v] layout, manual causal attention (no SDPA in torch 1.13).


def build_model(torch, args):
    nn, F = torch.nn, torch.nn.functional
    use_sdpa = args.attention == "sdpa"
    C, NH, L = args.hidden_size, args.num_attention_heads, args.num_layers

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)
            mask = torch.ones(args.max_position_embeddings, args.max_position_embeddings).tril()
            self.register_buffer("mask", mask, persistent=False)

        def attention(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            if use_sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                   dropout_p=args.attention_dropout)
                return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // NH))
            att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf"))
            y = F.dropout(F.softmax(att, dim=-1), args.attention_dropout) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x):
            p = args.hidden_dropout
            x = x + F.dropout(self.attention(self.ln_1(x)), p)
            return x + F.dropout(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")), p)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab_size, C)
            self.wpe = nn.Embedding(args.max_position_embeddings, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = F.dropout(self.wte(idx) + self.wpe(torch.arange(T)), args.hidden_dropout)
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    model = GPT()
    # GPT-2 init: N(0, 0.02); residual projections N(0, 0.02 / sqrt(2 L)); LN 1/0; biases 0.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("c_proj.weight", "mlp_proj.weight")):
                p.normal_(0.0, 0.02 / math.sqrt(2 * L))
            elif p.dim() == 2:
                p.normal_(0.0, 0.02)
            elif "ln_" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()
    return model


# ------------------------------------------------------------------------------------------------


def main(argv):
    args = parse_args(argv)
    # OpenBLAS sizes its own thread pool from the environment when torch loads it.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    if args.passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    major = int(torch.__version__.split(".")[0])
    if args.attention == "auto":
        args.attention = "sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") \
            else "manual"
    model = build_model(torch, args)
    fused = {"on": True, "off": False}.get(args.fused_adamw)
    if fused is None:
        minor = int(torch.__version__.split(".")[1])
        fused = (major, minor) >= (2, 4)
    opt_kw = {"fused": True} if fused else {}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay, **opt_kw)
    if args.compile:
        if not hasattr(torch, "compile"):
            sys.exit(f"--compile needs PyTorch >= 2 (this is {torch.__version__}); use the venv "
                     "of bench/setup-peer-venv")
        model = torch.compile(model)
    B, T, V = args.micro_batch_size, args.seq_length, args.vocab_size
    total = args.warmup + args.steps
    batches = [(torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))) for _ in range(total)]
    use_bf16 = args.dtype == "bf16"

    losses = []

    def step(i):
        idx, targets = batches[i % len(batches)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            loss = model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss))

    was_idle = wait_until_idle(args.wait_idle) if args.wait_idle > 0 else None
    for i in range(args.warmup):
        step(i)

    best = None  # (foreign cores over the run, step_ms, per-step foreign cores): least disturbed
    for attempt in range(1, args.attempts + 1):
        step_ms, foreign = [], []
        run_meter, step_meter = LoadMeter(), LoadMeter()
        run_meter.start()
        for i in range(args.steps):
            step_meter.start()
            t0 = time.perf_counter()
            step(args.warmup + i)
            step_ms.append((time.perf_counter() - t0) * 1e3)
            foreign.append(step_meter.stop())
        run_foreign = run_meter.stop()
        if best is None or run_foreign < best[0]:
            best = (run_foreign, step_ms, foreign)
        if args.max_foreign_cores is None or run_foreign <= args.max_foreign_cores:
            break
        if attempt < args.attempts and args.wait_idle > 0:
            wait_until_idle(args.wait_idle)
    run_foreign, step_ms, foreign = best
    # Steps during which other processes used < 0.15 cores (cpu-baselines.md's gate).
    clean = [ms for ms, f in zip(step_ms, foreign) if f < 0.15]

    n_params = sum(p.numel() for p in model.parameters())  # tied output layer counted once
    flops = B * T * (6 * n_params + 12 * args.num_layers * args.hidden_size * T)
    median_ms = statistics.median(step_ms)
    print(json.dumps({
        "system": "pytorch",
        "dtype": args.dtype,
        "median_ms": round(median_ms, 2),
        "step_ms": [round(x, 2) for x in step_ms],
        "tokens_per_s": round(B * T / (median_ms / 1e3), 2),
        "gflops_per_s": round(flops / (median_ms / 1e3) / 1e9, 2),
        "flops_per_step": flops,
        "num_params": n_params,
        "first_loss": round(losses[0], 4),
        "config": {"num_layers": args.num_layers, "hidden_size": args.hidden_size,
                   "num_attention_heads": args.num_attention_heads, "vocab_size": V,
                   "micro_batch_size": B, "seq_length": T, "threads": args.threads,
                   "warmup": args.warmup, "steps": args.steps, "passive": args.passive},
        "clean_median_ms": round(statistics.median(clean), 2) if clean else None,
        "clean_steps": len(clean),
        "foreign_cores": round(run_foreign, 3),
        "foreign_cores_per_step": [round(x, 3) for x in foreign],
        "attempts": attempt,
        "was_idle_before": was_idle,
        "torch": torch.__version__,
        "compile": args.compile,
        "fused_adamw": fused,
        "attention": args.attention,
        # Peak resident set of this process (KiB on Linux), model build and warm-up included.
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cpu": cpu_model(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
