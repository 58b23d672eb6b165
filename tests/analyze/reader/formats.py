"""Log text built exactly to docs/llama-cpp-lines.md (format strings rendered by hand, widths kept).

Used where no real capture has the wording: the fork's DFlash lines, old and new prefixes, server lines.
"""

from __future__ import annotations

SEQ_IDX = "[0" + "." * 255 + "]"
DRAFTER_BUF = "0x7f3a2c00a410"  # each caller reuses its own llama_batch, so its pointers


def batch_dump(prefix: str, pos0: int, n: int, outputs: int, embd: str = "(nil)", buf: str = "0x7f3a2c004410") -> list[str]:
    """`init: input batch info` + ubatch_print block + token rows + seq block, then the ubatch repeat (#batch-dumps)."""
    p = prefix
    block = [
        f"{p}ubatch_print:   equal_seqs   = 0",
        f"{p}ubatch_print:   n_tokens     = {n}",
        f"{p}ubatch_print:   n_seq_tokens = 1",
        f"{p}ubatch_print:   n_seqs       = {n}",
        f"{p}ubatch_print:   n_seqs_unq   = 1",
        f"{p}ubatch_print:   token      = 0x7f3a2c0041d0",
        f"{p}ubatch_print:   embd       = {embd}",
        f"{p}ubatch_print:   pos        = {buf}",
        f"{p}ubatch_print:   n_seq_id   = 0x7f3a2c004650",
        f"{p}ubatch_print:   seq_id     = 0x7f3a2c004890",
        f"{p}ubatch_print:   seq_id_unq = [ 0 ]",
        f"{p}ubatch_print:   seq_idx    = {SEQ_IDX}",
        f"{p}ubatch_print:   output     = 0x7f3a2c004b10",
        f"{p}ubatch_print:   n_outputs  = {outputs}",
        f"{p}ubatch_print:   token     = [",
    ]
    for i in range(n):
        piece = "Hello" if i % 3 else "\n"  # a newline piece splits the row over two lines
        out = int(i >= n - outputs)
        block.append(f"{p}ubatch_print:  {i:4d}: id = {1234 + i:6d} ({piece:>16s}), pos = {pos0 + i:4d}, "
                     f"n_seq_id = {1:2d}, seq_id = [0], output = {out}")
    block.append(f"{p}ubatch_print:   ]")
    head = [f"{p}init: input batch info:"]
    seqs = [f"{p}init:   seq       = [", f"{p}init:  {0:4d}: pos = [{pos0:4d}, {pos0 + n - 1:4d}], cpl = -",
            f"{p}init:   ]"]
    split = [f"{p}ubatch_add: added ubatch to split:"]
    return "\n".join(head + block + seqs + split + block).split("\n")


def find_slot(prefix: str, size: int, pos_min: int, pos_max: int, used: int = 0) -> list[str]:
    """#kv-cache-lines: `find_slot: stream[...]` with the cache size, then min/max of each sequence."""
    return [
        f"{prefix}find_slot: stream[0], n = {used:5d}, used = {used:5d}, head = {used:5d}, size = {size:5d}, "
        f"n_swa = {0:5d}",
        f"{prefix}find_slot: stream[0] min[0] = {pos_min:5d}, max[0] = {pos_max:5d}",
    ]


def position_error(prefix: str, seq: int, x: int, y: int, closing: str = "consecutive") -> list[str]:
    """#the-position-check: one log call, so only the first line is prefixed."""
    close = {
        "consecutive": " it is required that the sequence positions remain consecutive: Y = X + 1",
        "mrope_lt": " for M-RoPE, it is required that the position satisfies: X < Y",
        "mrope_le": " for M-RoPE, it is required that the position satisfies: X <= Y",
    }[closing]
    return [
        f"{prefix}init: the tokens of sequence {seq} in the input batch have inconsistent sequence positions:",
        f" - the last position stored in the memory module of the context (i.e. the KV cache) for sequence {seq} "
        f"is X = {x}",
        f" - the tokens for sequence {seq} in the input batch have a starting position of Y = {y}",
        close,
    ]


def drafter_failure(e: str, seq: int, x: int, y: int) -> list[str]:
    """#the-seed-reports-sequence: the whole sequence a failing flat DFlash draft prints (fork)."""
    return position_error(e, seq, x, y) + [
        f"{e}decode: failed to initialize batch",
        f"{e}llama_decode: failed to decode, ret = -1",
        f"{e}dflash: drafter decode failed with -1",
    ]


def new_scheme(t: float, level: str) -> str:
    """`M.SS.mmm.uuu L ` (#line-anatomy)."""
    m, s = divmod(t, 60)
    ms = int(round((s - int(s)) * 1e6))
    return f"{int(m)}.{int(s):02d}.{ms // 1000:03d}.{ms % 1000:03d} {level} "


def stale_drafter_log(prefixed: bool = True) -> str:
    """A DFlash run whose drafter is stuck at 259 while the target climbs: the seed report, with
    batch dumps, find_slot lines, the fork's reset warning and slot lines."""
    lines: list[str] = []
    t = 10.0

    def pre(level: str) -> str:
        nonlocal t
        t += 0.001
        return new_scheme(t, level) if prefixed else ""

    lines.append(f"{pre('I')}llama_kv_cache: size =   64.00 MiB ( 32768 cells,  64 layers,  1/1 seqs), K (f16): 32.00 MiB, V (f16): 32.00 MiB")
    lines.append(f"{pre('I')}srv    load_model: loading draft model '/models/drafter.gguf'")
    lines.append(f"{pre('I')}llama_kv_cache: size =    1.00 MiB (   256 cells,   1 layers,  1/1 seqs), K (f16): 0.50 MiB, V (f16): 0.50 MiB")
    lines.append(f"{pre('I')}common_speculative_init: adding implementation dflash")
    lines.append(f"{pre('I')}slot update_slots: id  0 | task 7 | new prompt, n_ctx_slot = 32768, n_keep = 0, task.n_tokens = 1355")
    # a healthy cycle: target verify at 1355.., drafter at 1355..
    lines += batch_dump(pre("D"), 1355, 4, 4)
    lines += find_slot(pre("D"), 32768, 0, 1354, 1355)
    lines += batch_dump(pre("D"), 250, 10, 10, buf=DRAFTER_BUF)
    lines += find_slot(pre("D"), 256, 0, 249, 250)
    for y in (1361, 1362, 1363):
        lines += batch_dump(pre("D"), y, 16, 16, buf=DRAFTER_BUF)
        lines += drafter_failure(pre("E"), 0, 259, y)
    lines.append(f"{pre('W')}dflash: clearing stale drafter KV for seq=0 before flat draft: pos_max=259 next_pos=1364")
    lines.append(f"{pre('D')}DFLASH_DBG clear drafter seq: seq=0 reason=flat draft pos_max=259")
    lines.append(f"{pre('I')}slot update_slots: id  0 | task 7 | accepted 3/15 draft tokens, new n_tokens = 1368")
    lines.append(f"{pre('I')}slot print_timing: id  0 | task 7 | draft acceptance = 0.16508 (  330 accepted /  1999 generated)")
    lines.append(f"{pre('I')}statistics           dflash: #calls(b,g,a) =    1    412    412, #gen drafts =    412, "
                 f"#acc drafts =   301, #gen tokens =   6180, #acc tokens =  1020, dur(b,g,a) = 0.052, 33012.441, 1.234 ms")
    lines.append(f"{pre('I')}slot      release: id  0 | task 7 | stop processing: n_tokens = 1400, truncated = 0")
    return "\n".join(lines) + "\n"
