#!/usr/bin/env bash
# kernel_bench.py's contract without a GPU (issue 32): --help and --list need no torch; bad input exits 2 with
# one stderr line and writes nothing; a good request on a machine without PyTorch or a GPU exits 3 with one line.
# The grid keeps the census contract: every planned kernel has class, kernel, pass, dtype, its shape fields,
# flops and bytes.  Usage: kernel_bench_cli.sh <workdir>
set -u
work=$1
here="$(dirname "${BASH_SOURCE[0]}")"
tool="$here/../tools/kernel_bench.py"
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work/adir"
# shellcheck source=../../cmake/cli_testlib.sh
source "$here/../../cmake/cli_testlib.sh"

expect 0 'kernel_bench.py' -- "$py" "$tool" --help
expect 0 '^# [0-9]+ kernels, predicted [0-9]+ s' -- "$py" "$tool" --list --grid quick
expect 0 '"class": "attention"' -- "$py" "$tool" --list --grid full --classes attention
expect 2 'unknown grid' -- "$py" "$tool" --grid huge --out "$work/k.json"
expect 2 "unknown class 'bogus'" -- "$py" "$tool" --classes gemm,bogus --out "$work/k.json"
expect 2 'is a directory' -- "$py" "$tool" --out "$work/adir"
expect 2 'does not exist' -- "$py" "$tool" --out "$work/no/such/k.json"
expect 2 'not a git commit' -- "$py" "$tool" --commit xyz --out "$work/k.json"
expect 2 'required' -- "$py" "$tool" --grid quick
expect 2 'unrecognized' -- "$py" "$tool" --bogus
for bad in "--grid huge --out $work/k.json" "--classes nope --out $work/k.json" "--out $work/adir"; do
  # shellcheck disable=SC2086
  one_line_error "$py" "$tool" $bad
done
# No GPU here (or no PyTorch): exit 3, one line, nothing written.
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  expect 3 'PyTorch|GPU' -- "$py" "$tool" --grid quick --commit 0123456789abcdef --out "$work/k.json"
  one_line_error "$py" "$tool" --grid quick --commit 0123456789abcdef --out "$work/k.json"
  check "no file written without a GPU" test ! -e "$work/k.json"
fi
# The full grid keeps the contract's fields; no kernel is planned twice.
"$py" "$tool" --list --grid full >"$work/full.jsonl"
check "--list --grid full exits 0" test $? -eq 0
"$py" - "$work/full.jsonl" <<'PY'
import json, sys
shape = {"gemm": ("m", "n", "k", "batch"), "attention": ("batch", "seq", "heads", "kv_heads", "head_dim", "causal"),
         "norm": ("tokens", "hidden"), "activation": ("tokens", "hidden"), "rotary": ("tokens", "heads", "head_dim"),
         "residual": ("tokens", "hidden"), "loss": ("tokens", "vocab"), "embedding": ("tokens", "hidden", "vocab"),
         "optimizer": ("params",), "grad-norm": ("params",), "cast": ("elements",),
         "router": ("tokens", "experts", "topk"), "permute": ("tokens", "hidden", "topk")}
seen, classes, bad = set(), set(), []
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    r = json.loads(line)
    classes.add(r["class"])
    for k in ("kernel", "pass", "dtype", "flops", "bytes") + shape[r["class"]]:
        if k not in r:
            bad.append("%s lacks %s" % (r, k))
    if r["pass"] not in ("forward", "backward", "step") or r["dtype"] not in ("bfloat16", "float8_e4m3", "float32"):
        bad.append("pass/dtype: %s" % r)
    if not (isinstance(r["bytes"], int) and r["bytes"] > 0 and isinstance(r["flops"], int) and r["flops"] >= 0):
        bad.append("flops/bytes: %s" % r)
    for k in shape[r["class"]]:
        if k != "causal" and not (isinstance(r.get(k), int) and r[k] > 0):
            bad.append("%s: %s" % (k, r))
    if r["class"] == "cast" and (r["rows"] * r["cols"] != r["elements"] or r["bytes"] != r["elements"] * {
            "cast-fp8": 4, "amax": 2}[r["kernel"]]):  # fused cast-transpose: bf16 read, fp8 and its transpose written
        bad.append("cast bytes or shape: %s" % r)
    if r["dtype"] == "float8_e4m3" and r["class"] == "gemm" and any(r[k] % 16 for k in "mnk"):
        bad.append("fp8 gemm not a multiple of 16: %s" % r)
    key = json.dumps(r, sort_keys=True)
    if key in seen:
        bad.append("twice: %s" % key)
    seen.add(key)
if classes != set(shape):
    bad.append("classes planned: %s" % sorted(classes))
for b in bad[:10]:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
check "the full grid keeps the census contract" test $? -eq 0
cli_summary
