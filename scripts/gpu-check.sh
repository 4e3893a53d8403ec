#!/usr/bin/env bash
# The GPU verification kit (issue 13): everything a lent GPU machine needs to check dpw's CUDA and
# wgpu backends in one call, built here where Rust is, run there where the GPU is.
#
#   scripts/gpu-check.sh build   (here, in the checkout the device tool sends) builds the release
#       dpw (with MPI, for the multi-GPU checks too) and the GPU test executables, NCCL's
#       included, strips them, packs them with a cpu lcurve.out to compare with (the tests'
#       reference numbers travel in the working tree), the Vulkan loader packages and Open
#       MPI's run time into .gpu-kit/kit.tar.xz (git-ignored), checks that the working tree and
#       the kit fit in the device tool's 64 MiB, and prints the exact call to make.
#   scripts/gpu-check.sh run     (on the GPU machine; no Rust there) prints the GPU and driver,
#       finds libcuda, libnvrtc and libcublas, then, most important first: the CUDA kernels'
#       NVRTC build and the cuda backend suite, a 200-step float64 training on cuda against the
#       cpu lcurve.out, `dpw bench` on cuda (float64 and float32, batch 1 and 16), DeePMD-kit
#       3.2.0's PyTorch backend on the same input and GPU (`dp --pt train`, from the wheels the
#       kit carries), the wgpu tests, lcurve parity and bench through Vulkan, compute-sanitizer's
#       memcheck on a short run, the multi-GPU checks (NCCL on one GPU; two ranks sharing a GPU
#       fall back to host MPI; with two GPUs, two ranks through NCCL, else 'n/a', which does not
#       fail the report), and writes report.md, report.json and logs.tar.gz under $OUT. Every
#       step has a time limit and the whole run stays under GPU_CHECK_BUDGET seconds (default
#       540). Without a GPU it says so, writes the report and exits 1 within seconds
#       (GPU_CHECK_FORCE=1 goes on: a dry run). GPU_CHECK_ONLY=REGEX runs only the steps whose
#       names match (the others are reported as skipped), GPU_CHECK_SKIP=REGEX skips those that
#       match (steps measured on earlier draws, to leave time for new ones).
#       GPU_CHECK_TEST_FILTER=NAME passes NAME to the test executables as libtest's filter (CI's
#       dry run: one quick test of a step). Last, the other models (DPA-1, DPA-3, DPA-2) and
#       DeePMD-kit's compiled PyTorch (`--pt-expt`), as the budget allows (model_checks).
#   scripts/gpu-check.sh more    (the follow-up, when the first call leaves time) the per-op
#       profile (`dpw bench --profile`), ncu's per-kernel times, wgpu's per-kernel GPU times
#       (DPW_WGPU_PROFILE), and the benches `run` leaves out (batch 4, frames not resident, wgpu at
#       batch 16); budget 200 s by default.
#       Both in one call: `bash scripts/gpu-check.sh run; OUT=$OUT/more bash scripts/gpu-check.sh more`.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KIT=$ROOT/.gpu-kit
# The test executables DeePMD-kit's reference and the water data are read by.
TESTS=(backend_cuda kernels_nvrtc backend_wgpu train_wgpu_parity)
LIMIT_BYTES=$((64 * 1024 * 1024))

die() {
  echo "gpu-check: $*" >&2
  exit 1
}

# An input for the water example: the shipped model on data_0..2 (validation data_3), with
# absolute paths, `steps` steps, displayed every `disp` steps, at batch size `batch`.
write_input() { # water_dir out_file steps disp batch
  python3 - "$@" <<'EOF'
import json, sys
water, out, steps, disp, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
v = json.load(open(f"{water}/input.json"))
v.pop("_comment", None)
t = v["training"]
t["training_data"]["systems"] = [f"{water}/data_{i}" for i in range(3)]
t["training_data"]["batch_size"] = batch
t["validation_data"]["systems"] = [f"{water}/data_3"]
t.update(numb_steps=steps, disp_freq=disp, save_freq=steps)
json.dump(v, open(out, "w"), indent=1)
EOF
}

# An example's input (its systems made absolute) for `steps` steps displayed every `disp`, as
# input.json in each of the given folders (made if missing).
example_input() { # input steps disp dir...
  python3 - "$@" <<'EOF'
import json, os, sys
path, steps, disp, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
src = os.path.dirname(os.path.abspath(path))
v = json.load(open(path))
t = v["training"]
for k in ("training_data", "validation_data"):
    t[k]["systems"] = [os.path.join(src, s) for s in t[k]["systems"]]
t.update(numb_steps=steps, disp_freq=disp, save_freq=steps)
for d in dirs:
    os.makedirs(d, exist_ok=True)
    json.dump(v, open(os.path.join(d, "input.json"), "w"), indent=1)
EOF
}

# The test executables of the named test targets in `cargo test --message-format=json` output,
# as "name path" lines.
executables() { # artifacts.json name...
  python3 - "$@" <<'EOF'
import json, sys
want = set(sys.argv[2:])
found = {}
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want:
        found[m["target"]["name"]] = m["executable"]
missing = want - found.keys()
if missing:
    sys.exit(f"no executable for test(s) {sorted(missing)}")
for name, exe in sorted(found.items()):
    print(name, exe)
EOF
}

# Open MPI's run time as installed here, for a device without MPI (the kit's dpw is linked
# against it): the packages of mpirun, libmpi and libpmix whole (MCA components, help texts), and
# the libraries they link that are not on every system. The device relocates it (OPAL_PREFIX).
stage_mpi() { # dest dpw
  local dest=$1 exe=$2 f p
  command -v mpirun >/dev/null && command -v dpkg >/dev/null ||
    die "the kit's dpw links libmpi: build the kit where Open MPI comes from Debian's packages (mpirun, dpkg)"
  local libmpi libpmix
  libmpi=$(ldd "$exe" | awk '/libmpi\.so/ {print $3}')
  [ -n "$libmpi" ] || die "$exe is not linked against libmpi"
  libpmix=$(find /usr/lib -name 'libpmix.so.2' 2>/dev/null | head -1)
  local owned=() pkgs=()
  for f in "$(readlink -f "$(command -v mpirun)")" "$(readlink -f "$libmpi")" \
    ${libpmix:+"$(readlink -f "$libpmix")"} /usr/share/openmpi/help-orterun.txt; do
    [ -e "$f" ] && owned+=("$f")
  done
  mapfile -t pkgs < <(dpkg -S "${owned[@]}" 2>/dev/null | cut -d: -f1 | sort -u)
  [ ${#pkgs[@]} -gt 0 ] || die "no Debian package owns mpirun/libmpi here"
  echo "Open MPI from: ${pkgs[*]}"
  local list=$KIT/mpi-files.txt
  for p in "${pkgs[@]}"; do
    dpkg -L "$p" | while read -r f; do
      if [ -L "$f" ] || [ -f "$f" ]; then echo "$f"; fi
    done
  done | grep -v -E '^/usr/share/(doc|man|lintian)/' >"$list"
  # What the launcher, libmpi, PMIx and the components of a local run link, beyond the base
  # system (the C library, zlib, udev) and what the packages hold.
  local deps
  mapfile -t deps < <(grep -E '/(mca_(pmix|ess|plm|odls|oob|btl_(self|vader|tcp)|pml_ob1|coll|schizo|state|errmgr|routed|rml|grpcomm|ras|rmaps)_[a-z0-9_]*|libpmix)\.so' "$list")
  ldd "$exe" "$(readlink -f "$(command -v mpirun)")" "${deps[@]}" 2>/dev/null |
    awk '/=> \// {print $3}' |
    grep -v -E '/(libc|libm|libz|libudev|libgcc_s|libstdc\+\+|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    sort -u | while read -r f; do
      # /lib is /usr/lib on merged-/usr systems: the package paths are under /usr.
      f=$(readlink -f "$(dirname "$f")")/$(basename "$f")
      grep -qxF "$f" "$list" || { echo "$f"; readlink -f "$f"; }
    done | sort -u >"$list.deps"
  cat "$list.deps" >>"$list"
  mkdir -p "$dest"
  sed 's|^/||' "$list" | tar -C / -cf - --files-from=- | tar -C "$dest" -xf -
  du -sh "$dest" | cut -f1 | sed 's/^/Open MPI run time: /'
}

build() {
  set -e
  for c in cargo python3 strip git tar xz; do
    command -v "$c" >/dev/null || die "build needs $c"
  done
  grep -qx '/.gpu-kit' .gitignore || die ".gpu-kit must be git-ignored (.gitignore)"
  rm -rf "$KIT"
  local stage=$KIT/stage
  mkdir -p "$stage/bin"

  # One build, scripts/test-all.sh's feature set (the default wgpu and cuda, and mpi: with cuda
  # that is also the NCCL all-reduce), so after its test phase nothing here is compiled again.
  # dpw comes out of `cargo test --no-run` (the bin built for the integration tests:
  # dev-dependencies unify features). With the mpi feature dpw trains serially unless an MPI
  # launcher started it, so one binary serves every step.
  echo "== release dpw (features wgpu, cuda, mpi), the GPU test executables, Open MPI"
  local args=(--test nccl_exchange)
  for t in "${TESTS[@]}"; do args+=(--test "$t"); done
  cargo test --release --no-run --features mpi --message-format=json "${args[@]}" >"$KIT/artifacts.json"
  executables "$KIT/artifacts.json" "${TESTS[@]}" nccl_exchange >"$KIT/executables.txt"
  while read -r name exe; do
    strip -o "$stage/bin/$name" "$exe"
  done <"$KIT/executables.txt"
  local dpw_exe
  dpw_exe=$(executables "$KIT/artifacts.json" dpw | cut -d' ' -f2)
  strip -o "$stage/bin/dpw" "$dpw_exe"
  stage_mpi "$stage/mpi" "$stage/bin/dpw"

  echo "== the cpu lcurve.out the cuda run must equal (200 steps, float64)"
  local work=$KIT/cpu-run
  mkdir -p "$work"
  write_input "$ROOT/examples/water" "$work/input.json" 200 20 1
  (cd "$work" && "$dpw_exe" train input.json --backend cpu)
  cp "$work/lcurve.out" "$stage/cpu-lcurve.out"
  rm -rf "$work"

  echo "== DeePMD-kit 3.2.0 and the pure-Python packages it needs that the device image lacks"
  # Wheels for the device's Python 3.12 (PyTorch 2.11 there matches the wheel's custom ops);
  # mpich because the wheel's op library links libmpi.so.12. A wheel is a zip (deflate): they
  # travel unpacked inside the xz tar, which holds them in 13.5 MiB instead of 23.4, and the run
  # half zips them again before pip installs them.
  local dl=$KIT/whl-download plat=() n w
  rm -rf "$dl" "$KIT/whl"
  mkdir -p "$dl" "$stage/whl"
  for n in 28 27 17 5; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" --platform manylinux2014_x86_64 -d "$dl" \
    deepmd-kit==3.2.0 dargs==0.5.1 typeguard==4.6.1 wcmatch==12.0.1 bracex==3.2.3 \
    array-api-compat==1.16.0 lmdb==3.0.0 mpich==5.0.2; then
    for w in "$dl"/*.whl; do
      # zipfile drops the mode bits (mpich's executables); they are set again from the zip.
      python3 -c 'import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for i in z.infolist():
    p = z.extract(i, sys.argv[2])
    if i.external_attr >> 16:
        os.chmod(p, i.external_attr >> 16)' "$w" "$stage/whl/$(basename "$w")"
    done
  else
    echo "warning: could not download DeePMD-kit's wheels: the side-by-side step will be skipped" >&2
  fi
  rm -rf "$dl"

  echo "== Vulkan loader packages (unpacked on the device only if it has no libvulkan)"
  mkdir -p "$stage/gl" /tmp/amd64/partial
  local o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
  if apt-get "${o[@]}" update >"$KIT/apt.log" 2>&1 &&
    (cd "$stage/gl" && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 \
      libgl1 libglx0 libgles2 >>"$KIT/apt.log" 2>&1); then
    ls "$stage/gl"
  else
    echo "warning: could not download the Vulkan loader packages (see $KIT/apt.log);" \
      "the wgpu steps will run only if the device has libvulkan" >&2
  fi

  {
    echo "MANIFEST_DIR=$ROOT"
    echo "GIT_REV=$(git rev-parse HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo -dirty)"
    echo "BUILT=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } >"$stage/kit.env"

  echo "== packing"
  # One xz block with a 128 MiB dictionary: the test executables and dpw each hold most of the
  # same library code, which a window wider than one binary stores once (four of them: 9.1 MB
  # against 16.5 MB at -6's 8 MiB). One block is one thread, under a minute here; the run half's
  # Python tarfile reads it.
  (cd "$KIT" && mv stage kit && tar -cf - kit |
    xz -T0 --lzma2=preset=6,dict=128MiB >"$KIT/kit.tar.xz" && mv kit stage)
  rm -rf "$stage"

  local tree kit total
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  kit=$(du -sb "$KIT" | cut -f1)
  total=$((tree + kit))
  awk -v t="$tree" -v k="$kit" 'BEGIN { m = 1048576
    printf "working tree %.1f MiB + kit %.1f MiB = %.1f MiB (limit 64 MiB)\n", t/m, k/m, (t+k)/m }'
  [ "$total" -le "$LIMIT_BYTES" ] || die "over the device tool's 64 MiB: it would refuse the call"
  cat <<EOF

Kit ready ($(git rev-parse --short HEAD)). The device runs the checkout the session was started
in, so build in that checkout (this is $ROOT). Then make this device call:

  run(carry=[".gpu-kit"], timeout_s=600,
      command="bash scripts/gpu-check.sh run; OUT=\$OUT/more bash scripts/gpu-check.sh more")

(about 5 minutes on an H100) and read report.md, more/report.md (report.json, logs.tar.gz)
from the files it brings back.
EOF
}

# ---------------------------------------------------------------------------------------- run

now() { date +%s; }

run_checks() {
  OUT=${OUT:-$KIT/out}
  mkdir -p "$OUT"
  local budget=${GPU_CHECK_BUDGET:-540}
  local t0
  t0=$(now)
  W=$(mktemp -d /tmp/gpu-check.XXXXXX)
  LOGS=$W/logs
  mkdir -p "$LOGS"
  RESULTS=$W/results.tsv
  : >"$RESULTS"
  INFO=$W/info.tsv
  : >"$INFO"

  TEST_FILTER=()
  [ -z "${GPU_CHECK_TEST_FILTER:-}" ] || TEST_FILTER=("$GPU_CHECK_TEST_FILTER")
  info() { printf '%s\t%s\n' "$1" "$2" >>"$INFO"; echo "$1: $2"; }
  # One step: `step NAME LIMIT_S command...`: its output goes to $LOGS/NAME.log; the limit is cut
  # to what the budget has left; a step with under 5 s left is skipped.
  step() {
    local name=$1 limit=$2
    shift 2
    if [ -n "${GPU_CHECK_ONLY:-}" ] && ! [[ $name =~ $GPU_CHECK_ONLY ]]; then
      skip "$name" "not in GPU_CHECK_ONLY"
      return 0
    fi
    if [ -n "${GPU_CHECK_SKIP:-}" ] && [[ $name =~ $GPU_CHECK_SKIP ]]; then
      skip "$name" "in GPU_CHECK_SKIP"
      return 0
    fi
    local left=$((budget - ($(now) - t0) - 15))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
      printf '%s\tskipped\t0\t-\tno time left in the %s s budget\n' "$name" "$budget" >>"$RESULTS"
      echo "-- $name: skipped (time budget)"
      return 0
    fi
    echo "-- $name (limit ${limit}s)"
    local s rc status
    s=$(now)
    timeout -k 5 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    case $rc in
      # A test that found no device skips and passes: here that is a failure to check.
      0) if grep -q 'SKIPPED' "$LOGS/$name.log"; then status=skipped_inside; else status=pass; fi ;;
      124 | 137) status=timeout ;;
      *) status=fail ;;
    esac
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$(($(now) - s))" "$rc" \
      "$(summary_of "$LOGS/$name.log")" >>"$RESULTS"
    echo "   $status (rc $rc, $(($(now) - s)) s): $(summary_of "$LOGS/$name.log")"
    return 0
  }
  # A step that is not run, with why.
  skip() { printf '%s\tskipped\t0\t-\t%s\n' "$1" "$2" >>"$RESULTS"; echo "-- $1: skipped ($2)"; }

  # What stops the run before any step, all of it said at once.
  local problems=()
  if [ ! -f "$KIT/kit.tar.xz" ]; then
    problems+=("the kit is missing: run \`scripts/gpu-check.sh build\` in the checkout first and carry .gpu-kit")
  fi

  # The GPU and its driver.
  if command -v nvidia-smi >/dev/null; then
    local q
    if q=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
      --format=csv,noheader 2>&1) && [ -n "$q" ]; then
      info gpu "$q"
      timeout 20 nvidia-smi >"$LOGS/nvidia-smi.log" 2>&1
    else
      info gpu "none"
      problems+=("nvidia-smi found no usable GPU: $q")
    fi
  else
    info gpu "none"
    problems+=("no NVIDIA GPU here: nvidia-smi is not installed (run this half on the lent GPU machine)")
  fi

  # libcuda (the driver), libnvrtc and libcublas, where cudarc looks for them. cudarc built for
  # CUDA 12.8 tries libX.so and libX.so.12 (not .so.13): a folder of libX.so links to what is
  # found makes any version loadable.
  local libs=$W/libs
  mkdir -p "$libs"
  local sp dirs=()
  sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu \
    /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64; do
    [ -d "$d" ] && dirs+=("$d")
  done
  for d in $sp; do
    [ -d "$d/nvidia" ] && dirs+=("$d/nvidia")
  done
  find_lib() { # name: the newest libNAME.so* by version, from ldconfig or under $dirs
    { ldconfig -p 2>/dev/null | awk -v n="lib$1.so" 'index($1, n) == 1 {print $NF}'
      find "${dirs[@]}" -maxdepth 4 -name "lib$1.so*" 2>/dev/null; } |
      grep -v /stubs/ | awk -F/ '{print $NF "\t" $0}' | sort -V | tail -1 | cut -f2
  }
  local ldp="$libs" name f
  for name in cuda nvrtc cublas cublasLt nvrtc-builtins nccl; do
    f=$(find_lib "$name")
    if [ -n "$f" ]; then
      info "lib$name" "$f"
      ln -sf "$f" "$libs/lib$name.so"
      case ":$ldp:" in *":$(dirname "$f"):"*) ;; *) ldp="$ldp:$(dirname "$f")" ;; esac
    else
      info "lib$name" "not found"
      [ "$name" = cuda ] && problems+=("libcuda (the NVIDIA driver library) not found")
    fi
  done
  export LD_LIBRARY_PATH="$ldp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

  # GPU_CHECK_FORCE=1 goes on without a GPU (a dry run of the kit: the cuda steps fail, wgpu
  # runs on whatever Vulkan adapter there is); a missing kit always stops.
  if [ ${#problems[@]} -gt 0 ] && { [ "${GPU_CHECK_FORCE:-0}" != 1 ] || [ ! -f "$KIT/kit.tar.xz" ]; }; then
    local fatal
    fatal=$(printf '%s; ' "${problems[@]}")
    fatal=${fatal%; }
    echo "gpu-check: $fatal" >&2
    report "$fatal"
    return 1
  fi

  # The kit, and the paths its test executables were built with (CARGO_MANIFEST_DIR of the build
  # machine): the water example, the tests' reference numbers and the dpw binary must be found there.
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$KIT/kit.tar.xz" "$W" || { report "could not unpack $KIT/kit.tar.xz"; return 1; }
  local K=$W/kit
  # shellcheck disable=SC1091
  . "$K/kit.env"
  info kit "$GIT_REV built $BUILT"
  info tree "$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  # A dry run (GPU_CHECK_FORCE=1, on a developer's machine) changes nothing outside $W.
  if [ "${GPU_CHECK_FORCE:-0}" != 1 ]; then
    if [ ! -e "$MANIFEST_DIR" ]; then
      mkdir -p "$(dirname "$MANIFEST_DIR")" && ln -s "$ROOT" "$MANIFEST_DIR"
    fi
    mkdir -p "$MANIFEST_DIR/target/release"
    cp "$K/bin/dpw" "$MANIFEST_DIR/target/release/dpw"
  fi
  local dpw=$K/bin/dpw water=$ROOT/examples/water
  kit_mpi_env "$K"

  export DPW_REQUIRE_CUDA=1 DPW_REQUIRE_NVRTC=1 RUST_LOG=info NO_COLOR=1
  local b
  for b in 1 4 16; do write_input "$water" "$W/bench-b$b.json" 100 100 "$b"; done
  if [ "$MODE" = more ]; then
    more_checks "$K" "$dpw" "$water"
  else
    main_checks "$K" "$dpw" "$water"
  fi

  report ""
  # n/a: a check this machine cannot make (one GPU for a multi-GPU check).
  grep -qvE $'\t(pass|n/a)\t' "$RESULTS" && return 1
  return 0
}

main_checks() { # kit dpw water
  local K=$1 dpw=$2 water=$3
  # CUDA: the kernels compile, the backend suite and the parity tests pass.
  step cuda_kernels_nvrtc 60 "$K/bin/kernels_nvrtc" "${TEST_FILTER[@]}" --nocapture
  step cuda_backend_suite 180 "$K/bin/backend_cuda" "${TEST_FILTER[@]}" --include-ignored --test-threads=1 --nocapture
  # DPA-1's attention block as kernels (kernels/attn_block.cu; off by default until this
  # passes): its per-op parity, DeePMD-kit's numbers and a whole step against the cpu.
  step cuda_attn_kernels 90 env DPW_CUDA_ATTN=kernels "$K/bin/backend_cuda" attn dpa1 se_atten \
    mixed --include-ignored --test-threads=1 --nocapture
  # DPA-2's, se_e3_tebd's and DPA-3's blocks through their tapes (kernels/tape.cu, one source
  # on reals and duals; off by default until this passes): a whole step of each against the cpu
  # (parity_tape_blocks) and DeePMD-kit's numbers (reference_dpa2_*, reference_se_e3_tebd_*,
  # reference_dpa3_*), then the first timings of DPA-2 so, float64 and float32.
  step cuda_tape_kernels 150 env DPW_CUDA_TAPE=kernels "$K/bin/backend_cuda" tape_blocks \
    reference_dpa2 reference_se_e3_tebd reference_dpa3 --include-ignored --test-threads=1 \
    --nocapture
  example_input "$water/input_dpa2.json" 300 50 "$W/tape"
  local p flag
  for p in f64 f32; do
    flag=()
    [ "$p" = f32 ] && flag=(--float32)
    step "bench_cuda+dpa2_tape_${p}_b1" 45 env DPW_CUDA_TAPE=kernels "$dpw" bench \
      "$W/tape/input.json" --backend cuda "${flag[@]}" --steps 10 --warmup 2 \
      --json "$LOGS/bench_cuda+dpa2_tape_${p}_b1.json"
  done

  # 200 float64 steps on cuda: lcurve.out equal to the cpu one.
  mkdir -p "$W/train"
  write_input "$water" "$W/train/input.json" 200 20 1
  cat >"$W/compare.py" <<'EOF'
import sys
a, b = (open(p).read() for p in sys.argv[1:3])
if a == b:
    print('lcurve.out identical to the cpu one'); sys.exit(0)
num = lambda s: [[float(x) for x in l.split()] for l in s.splitlines() if l and not l.startswith('#')]
na, nb = num(a), num(b)
err = max((abs(x - y) / max(abs(x), 1e-300) for ra, rb in zip(na, nb) for x, y in zip(ra, rb)), default=float('nan'))
print(f'lcurve.out differs from the cpu one ({len(na)} vs {len(nb)} lines, max relative difference {err:.3e})')
sys.exit(1)
EOF
  step cuda_train_200 90 bash -c "cd '$W/train' && '$dpw' train input.json --backend cuda &&
    python3 '$W/compare.py' '$K/cpu-lcurve.out' lcurve.out"

  info cuda_device "$(grep -m1 -o 'CUDA device .*' "$LOGS/cuda_train_200.log" 2>/dev/null || echo unknown)"

  # Speed: dpw bench on cuda, float64 and float32, batch 1 and 16 (batch 4 in `more`).
  local b p
  for p in f64 f32; do
    for b in 1 16; do bench_step cuda "$p" "$b" 45; done
  done

  # The variant without the CUDA graph (DPW_CUDA_GRAPH=0; by default the training step's
  # forward + gradient is captured once and replayed): the backend suite, the 200 steps with
  # lcurve.out equal to the cpu one, and its speed.
  step cuda_suite_nograph 120 env DPW_CUDA_GRAPH=0 "$K/bin/backend_cuda" "${TEST_FILTER[@]}" --include-ignored \
    --test-threads=1 --nocapture
  mkdir -p "$W/train-nograph"
  cp "$W/train/input.json" "$W/train-nograph/input.json"
  step cuda_train_200_nograph 90 bash -c "cd '$W/train-nograph' &&
    DPW_CUDA_GRAPH=0 '$dpw' train input.json --backend cuda &&
    python3 '$W/compare.py' '$K/cpu-lcurve.out' lcurve.out"
  # The default path's last log line counts captures and replays.
  info cuda_graph_counts "$(grep -o 'DPW_CUDA_GRAPH: [0-9]* captures.*' \
    "$LOGS/cuda_train_200.log" 2>/dev/null | tail -n1 || echo unknown)"
  for p in f64 f32; do
    for b in 1 16; do
      local flag=()
      [ "$p" = f32 ] && flag=(--float32)
      step "bench_cuda-nograph_${p}_b$b" 30 env DPW_CUDA_GRAPH=0 "$dpw" bench "$W/bench-b$b.json" \
        --backend cuda "${flag[@]}" --steps 30 --warmup 5 --json "$LOGS/bench_cuda-nograph_${p}_b$b.json"
    done
  done
  # Many systems, so many batch shapes (the alloy example: four compositions): the graph path
  # (the default) must give the eager path's lcurve.out, and its capture guard decides when to
  # stop capturing.
  local alloy=$W/alloy
  example_input "$ROOT/examples/alloy/input.json" 300 50 "$alloy/default" "$alloy/nograph"
  step cuda_alloy 90 bash -c "
    s=\$(date +%s.%N); cd '$alloy/default' && '$dpw' train input.json --backend cuda || exit 1
    m=\$(date +%s.%N); cd '$alloy/nograph' && DPW_CUDA_GRAPH=0 '$dpw' train input.json --backend cuda || exit 1
    e=\$(date +%s.%N)
    python3 -c 'import sys; a, b, c = map(float, sys.argv[1:]); print(f\"alloy 300 steps wall: graph (default) {b - a:.2f} s, no graph {c - b:.2f} s\")' \$s \$m \$e
    python3 '$W/compare.py' '$alloy/nograph/lcurve.out' '$alloy/default/lcurve.out'"
  info cuda_alloy "$(grep -o 'alloy 300 steps wall.*' "$LOGS/cuda_alloy.log" 2>/dev/null) $(grep -o 'DPW_CUDA_GRAPH: [0-9]* captures.*' \
    "$LOGS/cuda_alloy.log" 2>/dev/null | tail -n1)"

  # DPA-1 (se_atten_v2 on the alloy, its attention ops on the host for now): 20 float64 steps
  # on cuda give the lcurve.out of the same binary's cpu run, made here.
  local dpa1=$W/dpa1
  example_input "$ROOT/examples/alloy/input_se_atten_v2.json" 20 5 "$dpa1/cpu" "$dpa1/cuda"
  step cuda_dpa1_train 90 bash -c "
    cd '$dpa1/cpu' && '$dpw' train input.json --backend cpu || exit 1
    cd '$dpa1/cuda' && '$dpw' train input.json --backend cuda || exit 1
    python3 '$W/compare.py' '$dpa1/cpu/lcurve.out' '$dpa1/cuda/lcurve.out'"

  # DeePMD-kit 3.2.0's PyTorch backend on the same GPU and input: the ratio, side by side.
  deepmd_pt "$water"

  # wgpu through Vulkan on the same GPU.
  vulkan_setup "$K"
  step wgpu_backend_suite 150 "$K/bin/backend_wgpu" "${TEST_FILTER[@]}" --test-threads=1 --nocapture
  local adapter
  adapter=$(grep -m1 -o 'wgpu adapter:.*' "$LOGS/wgpu_backend_suite.log" 2>/dev/null || echo unknown)
  info wgpu_adapter "$adapter"
  # Passing on a software adapter (lavapipe) proves nothing about the GPU.
  [ -s "$LOGS/wgpu_backend_suite.log" ] && case $adapter in
    *"cpu adapter: false"*) printf 'wgpu_on_the_gpu\tpass\t0\t0\t%s\n' "$adapter" >>"$RESULTS" ;;
    *) printf 'wgpu_on_the_gpu\tfail\t0\t-\tnot a GPU adapter: %s\n' "$adapter" >>"$RESULTS" ;;
  esac
  step wgpu_train_parity 90 "$K/bin/train_wgpu_parity" "${TEST_FILTER[@]}" --nocapture
  for p in f64 f32; do bench_step wgpu "$p" 1 45; done
  info wgpu_variants "$(grep -m1 -o 'dense kernels [a-z]*, passes [a-z]*' "$LOGS/bench_wgpu_f64_b1.log" 2>/dev/null || echo unknown)"
  # A compute pass per dispatch (the default shares one between the dispatches of a submit).
  for p in f64 f32; do DPW_WGPU_PASSES=each bench_step wgpu "$p" 1 45 -each; done
  # The other dense kernels (the default on a GPU adapter is tiled; flat is software Vulkan's).
  DPW_WGPU_DENSE=flat bench_step wgpu f64 1 45 -flat

  # compute-sanitizer memcheck on a short cuda run.
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$cs" ]; then
    mkdir -p "$W/san"
    write_input "$water" "$W/san/input.json" 2 1 1
    step cuda_memcheck 120 bash -c "cd '$W/san' && '$cs' --tool memcheck --error-exitcode 9 \
      --print-limit 20 '$dpw' train input.json --backend cuda"
  else
    skip cuda_memcheck "compute-sanitizer not found"
  fi

  mpi_checks "$K" "$dpw" "$water"
  model_checks "$dpw" "$water"
}

# The follow-up call (`more`, only when the first left >= 4 minutes of device time): where the
# step's time goes (dpw's per-op profile, ncu's per-kernel times) and the benches `run` left out.
more_checks() { # kit dpw water
  local K=$1 dpw=$2 water=$3 p
  for p in f64 f32; do
    local flag=()
    [ "$p" = f32 ] && flag=(--float32)
    step "profile_cuda_${p}_b1" 40 "$dpw" bench "$W/bench-b1.json" --backend cuda "${flag[@]}" \
      --profile --steps 20 --warmup 5 --json "$LOGS/profile_cuda_${p}_b1.json"
  done
  local ncu
  ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  if [ -n "$ncu" ]; then
    # Kernel times of a few steps after warm-up, summed per kernel (the replay serialises them).
    step ncu_kernels 90 "$ncu" --csv --print-summary per-kernel --metrics gpu__time_duration.sum \
      --launch-skip 400 --launch-count 400 "$dpw" bench "$W/bench-b1.json" --backend cuda \
      --steps 4 --warmup 2
  else
    skip ncu_kernels "ncu not found"
  fi
  for p in f64 f32; do bench_step cuda "$p" 4 30; done
  # The variant with every batch assembled on the host and copied each step.
  step bench_cuda-noresident_f64_b1 30 env DPW_RESIDENT_MB=0 "$dpw" bench "$W/bench-b1.json" \
    --backend cuda --steps 30 --warmup 5 --json "$LOGS/bench_cuda-noresident_f64_b1.json"
  vulkan_setup "$K"
  # wgpu's device time per kernel and between kernels (GPU timestamps), float64 and float32.
  for p in f64 f32; do
    local flag=()
    [ "$p" = f32 ] && flag=(--float32)
    step "profile_wgpu_${p}_b1" 40 env DPW_WGPU_PROFILE=1 "$dpw" bench "$W/bench-b1.json" \
      --backend wgpu "${flag[@]}" --steps 10 --warmup 3
  done
  for p in f64 f32; do bench_step wgpu "$p" 16 30; done
  DPW_WGPU_PASSES=each bench_step wgpu f64 16 30 -each
  DPW_WGPU_DENSE=flat bench_step wgpu f32 1 30 -flat
}

# `dpw bench` on one backend, precision and batch size, its JSON kept for the report.
bench_step() { # backend f64|f32 batch limit_s [variant suffix]
  local flag=() name="bench_$1${5:-}_$2_b$3"
  [ "$2" = f32 ] && flag=(--float32)
  step "$name" "$4" "$dpw" bench "$W/bench-b$3.json" --backend "$1" "${flag[@]}" \
    --steps 30 --warmup 5 --json "$LOGS/$name.json"
}

# DeePMD-kit 3.2.0's PyTorch backend (`dp --pt train`) on the water input at batch 1 and 16,
# float64 and float32: s/step over the display intervals after the first (the first holds start-up and
# PyTorch's warm-up), written as a bench JSON so that the report sets it beside dpw's.
deepmd_pt() { # water
  local water=$1 p
  if ! compgen -G "$K/whl/deepmd_kit-*.whl" >/dev/null; then
    skip deepmd_pt "no DeePMD-kit wheel in the kit"
    return 0
  fi
  # The kit carries each wheel unpacked, in a folder named as the wheel (see build).
  rm -rf "$W/whl" && mkdir -p "$W/whl"
  step deepmd_pt_wheels 60 python3 -c 'import os, sys, zipfile
for d in sys.argv[2:]:
    with zipfile.ZipFile(os.path.join(sys.argv[1], os.path.basename(d)), "w", zipfile.ZIP_STORED) as z:
        for root, _, files in os.walk(d):
            for f in files:
                p = os.path.join(root, f)
                z.write(p, os.path.relpath(p, d))' "$W/whl" "$K"/whl/*.whl
  # --prefix, not --target: --target drops a wheel's data files, and DeePMD-kit finds the
  # libmpi.so.12 its op library links through mpich's file list.
  local prefix=$W/py site
  DP_PREFIX=$prefix DP_SITE=
  step deepmd_pt_install 60 python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --prefix "$prefix" "$W"/whl/*.whl
  # mendeleev (with a dozen packages of its own) serves DeePMD-kit's electronic-configuration
  # type embedding and the sorting of a type map by atomic number; a stub that knows atomic
  # numbers alone stands in.
  mkdir -p "$W/stub/mendeleev"
  cat >"$W/stub/mendeleev/__init__.py" <<'EOF'
_SYMBOLS = """H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge
As Se Br Kr Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb
Dy Ho Er Tm Yb Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf
Es Fm Md No Lr Rf Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og""".split()


class _Element:
    def __init__(self, symbol):
        if symbol not in _SYMBOLS:
            raise ValueError(f"unknown element {symbol!r}")
        self.symbol = symbol
        self.atomic_number = _SYMBOLS.index(symbol) + 1


def element(symbol):
    return _Element(symbol)
EOF
  site=$(python3 -c 'import sys, sysconfig
print(sysconfig.get_path("purelib", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))' "$prefix")
  grep -q $'^deepmd_pt_install\tpass' "$RESULTS" && DP_SITE=$site
  cat >"$W/dp_time.py" <<'EOF'
import json, re, sys
log, out, prec, steps_per = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
walls = [float(m) for m in re.findall(r"Batch +\d+: total wall time = ([0-9.]+) s", open(log).read())]
if len(walls) < 2:
    sys.exit(f"{log}: fewer than two 'total wall time' lines")
# The median interval: a compiled run (pt-expt) compiles again when a batch's shape is new,
# which a mean would spread over the steps.
s = sorted(walls[1:])[(len(walls) - 2) // 2] / steps_per
json.dump(dict(precision=prec, median_s_per_step=s, intervals=walls), open(out, "w"))
print(f"DeePMD-kit 3.2.0 {prec}: {s:.6f} s/step, the median of {len(walls) - 1} intervals of {steps_per}")
EOF
  local b
  for p in f64 f32; do
    for b in 1 16; do
      local d=$W/dp-$p-b$b
      mkdir -p "$d"
      write_input "$water" "$d/input.json" 500 100 "$b"
      [ "$p" = f32 ] && precision_f32 "$d/input.json"
      dp_train "deepmd_pt_${p}_b$b" 120 "$d" pt "bench_deepmdpt_${p}_b$b" "$p" 100
    done
  done
}

# One DeePMD-kit training in a folder holding its input.json, timed into $LOGS/BENCH.json:
# backend pt (eager) or pt-expt (compiled: training.enable_compile set here; its first display
# interval holds the compilation, which dp_time.py leaves out).
dp_train() { # step limit_s dir pt|pt-expt bench_name f64|f32 disp
  local name=$1 limit=$2 d=$3 backend=$4 bench=$5 p=$6 disp=$7
  if [ -z "${DP_SITE:-}" ]; then
    skip "$name" "DeePMD-kit is not installed (deepmd_pt_install)"
    return 0
  fi
  [ "$backend" = pt-expt ] && python3 - "$d/input.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
v["training"]["enable_compile"] = True
json.dump(v, open(sys.argv[1], "w"), indent=1)
EOF
  # mpich's libmpi finds its own libfabric through RUNPATH, which LD_LIBRARY_PATH (holding
  # the system's older one beside libnccl) would override.
  step "$name" "$limit" bash -c "cd '$d' && \
    LD_LIBRARY_PATH='$DP_PREFIX/lib/mpich${LDP_WITHOUT_KIT_MPI:+:$LDP_WITHOUT_KIT_MPI}' PYTHONPATH='$DP_SITE:$W/stub' \
    python3 -m deepmd --$backend train input.json >dp.log 2>&1; rc=\$?; tail -40 dp.log
    [ \$rc = 0 ] || exit \$rc
    python3 '$W/dp_time.py' dp.log '$LOGS/$bench.json' '$p' $disp"
}

# The models beyond water's se_e2_a, and DeePMD-kit's compiled PyTorch (`--pt-expt`), after the
# checks above so that a slow compilation cannot starve them: for DPA-1 (the alloy's
# se_atten_v2), DPA-3 and DPA-2 (water), a few float64 steps on cuda give the same binary's cpu
# lcurve.out, then `dpw bench` on cuda beside DeePMD-kit --pt and --pt-expt, float64, batch 1.
model_checks() { # dpw water
  local dpw=$1 water=$2
  ptexpt_water "$water" f64
  local m input steps
  for m in dpa1:$ROOT/examples/alloy/input_se_atten_v2.json:4 dpa3:$water/input_dpa3.json:3 \
    dpa2:$water/input_dpa2.json:2; do
    IFS=: read -r m input steps <<<"$m"
    local dir=$W/model-$m
    example_input "$input" "$steps" 1 "$dir/cpu" "$dir/cuda"
    [ "$m" = dpa1 ] || step "cuda_${m}_train" 120 bash -c "
      cd '$dir/cpu' && '$dpw' train input.json --backend cpu || exit 1
      cd '$dir/cuda' && '$dpw' train input.json --backend cuda || exit 1
      python3 '$W/compare.py' '$dir/cpu/lcurve.out' '$dir/cuda/lcurve.out'"
    example_input "$input" 300 50 "$dir/bench" "$dir/pt" "$dir/ptexpt"
    step "bench_cuda+${m}_f64_b1" 60 "$dpw" bench "$dir/bench/input.json" --backend cuda \
      --steps 20 --warmup 3 --json "$LOGS/bench_cuda+${m}_f64_b1.json"
    # DPA-1's attention block is kernels on wgpu (shaders/attn_block.wgsl) and, with
    # DPW_CUDA_ATTN=kernels, on cuda (kernels/attn_block.cu): their first timings.
    if [ "$m" = dpa1 ]; then
      step "bench_cuda+dpa1_kernels_f64_b1" 60 env DPW_CUDA_ATTN=kernels "$dpw" bench \
        "$dir/bench/input.json" --backend cuda --steps 20 --warmup 3 \
        --json "$LOGS/bench_cuda+dpa1_kernels_f64_b1.json"
      local p flag
      for p in f64 f32; do
        flag=()
        [ "$p" = f32 ] && flag=(--float32)
        step "bench_wgpu+dpa1_${p}_b1" 60 "$dpw" bench "$dir/bench/input.json" --backend wgpu \
          "${flag[@]}" --steps 20 --warmup 3 --profile --json "$LOGS/bench_wgpu+dpa1_${p}_b1.json"
      done
    fi
    dp_train "deepmd_pt_${m}_f64_b1" 120 "$dir/pt" pt "bench_deepmdpt+${m}_f64_b1" f64 50
    dp_train "deepmd_ptexpt_${m}_f64_b1" 180 "$dir/ptexpt" pt-expt "bench_deepmdptexpt+${m}_f64_b1" f64 50
  done
  ptexpt_water "$water" f32
}

# DeePMD-kit's compiled PyTorch on the water input at batch 1.
ptexpt_water() { # water f64|f32
  local d=$W/dpx-$2-b1
  mkdir -p "$d"
  write_input "$1" "$d/input.json" 300 50 1
  [ "$2" = f32 ] && precision_f32 "$d/input.json"
  dp_train "deepmd_ptexpt_$2_b1" 180 "$d" pt-expt "bench_deepmdptexpt_$2_b1" "$2" 50
}

# An input made float32 (descriptor and fitting net).
precision_f32() { # input.json
  python3 - "$1" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
for k in ("descriptor", "fitting_net"):
    v["model"][k]["precision"] = "float32"
json.dump(v, open(sys.argv[1], "w"), indent=1)
EOF
}

# The Vulkan loader from the kit if the image lacks one, and NVIDIA's ICD where the image keeps it
# out of the loader's search path.
vulkan_setup() { # kit
  local K=$1 f
  if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1'; then
    if compgen -G "$K/gl/*.deb" >/dev/null; then
      for f in "$K"/gl/*.deb; do dpkg -x "$f" /; done
      ldconfig
      info vulkan "loader unpacked from the kit"
    else
      info vulkan "no libvulkan and none in the kit"
    fi
  else
    info vulkan "loader present"
  fi
  local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -f "$icd" ] && ! ls /usr/share/vulkan/icd.d/nvidia* /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
    export VK_DRIVER_FILES=$icd
    info vulkan_icd "$icd"
  fi
  export WGPU_BACKEND=vulkan
}

# The kit's Open MPI, relocated (OPAL_PREFIX), ahead of everything: the kit's dpw links libmpi,
# so every step needs it, not only the 2-rank ones. DeePMD-kit's steps get the library path as
# it was before (LDP_WITHOUT_KIT_MPI): its wheel brings MPICH.
kit_mpi_env() { # kit
  local r=$1/mpi/usr
  LDP_WITHOUT_KIT_MPI=${LD_LIBRARY_PATH:-}
  KIT_MPIRUN=
  [ -x "$r/bin/orterun" ] || return 0
  export OPAL_PREFIX=$r PMIX_INSTALL_PREFIX=$r/lib/x86_64-linux-gnu/pmix2
  export LD_LIBRARY_PATH=$r/lib/x86_64-linux-gnu:$r/lib/x86_64-linux-gnu/openmpi/lib:$r/lib/x86_64-linux-gnu/pmix2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  KIT_MPIRUN=$r/bin/orterun
}

# Multi-GPU training (features mpi + cuda): NCCL on one GPU as a one-rank world; two ranks on one
# GPU, which must fall back to host MPI (NCCL refuses two ranks on one device) and train as one
# rank with the global batch does; and, given two GPUs, two ranks through NCCL, whose lcurve.out
# must equal host MPI's (in float64 a sum of two is the same in either order). mpirun and Open
# MPI come from the kit (see kit_mpi_env), else from the device.
mpi_checks() { # kit dpw water
  local K=$1 dpw=$2 water=$3 ngpu
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  info gpus "$ngpu"
  [ -n "$(find_lib nccl)" ] && export DPW_REQUIRE_NCCL=1
  step nccl_one_rank 60 "$K/bin/nccl_exchange" "${TEST_FILTER[@]}" --include-ignored --nocapture
  unset DPW_REQUIRE_NCCL

  local mpirun
  if [ -n "$KIT_MPIRUN" ]; then
    mpirun=$KIT_MPIRUN
    info mpi "Open MPI from the kit ($("$mpirun" --version 2>&1 | head -1))"
  elif command -v mpirun >/dev/null && ! ldd "$dpw" | grep -q 'libmpi.*not found'; then
    mpirun=$(command -v mpirun)
    info mpi "the device's mpirun ($("$mpirun" --version 2>&1 | head -1))"
  else
    info mpi "none"
    skip mpi_2ranks_1gpu "no MPI: none in the kit (build it where Open MPI is installed) and no mpirun here"
    skip mpi_2ranks_nccl "no MPI"
    return 0
  fi
  export OMPI_MCA_mca_base_component_show_load_errors=0
  local np2=("$mpirun" --allow-run-as-root --oversubscribe -np 2 "$dpw" train input.json --backend cuda)

  local d=$W/mpi
  mkdir -p "$d/shared" "$d/serial" "$d/nccl" "$d/host"
  for x in shared nccl host; do write_input "$water" "$d/$x/input.json" 20 5 1; done
  write_input "$water" "$d/serial/input.json" 20 5 2
  # Two ranks follow one rank with the global batch only at the same learning rate: DeePMD-kit's
  # default scale_by_worker (linear) doubles it on two ranks.
  for x in shared nccl host serial; do
    python3 - "$d/$x/input.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
v["learning_rate"]["scale_by_worker"] = "none"
json.dump(v, open(sys.argv[1], "w"), indent=1)
EOF
  done
  step mpi_2ranks_1gpu 150 bash -c "
    cd '$d/shared' && CUDA_VISIBLE_DEVICES=0 ${np2[*]} >log 2>&1; rc=\$?; cat log; [ \$rc = 0 ] || exit \$rc
    grep -q 'host MPI, not NCCL: ranks 0, 1 share GPU' log || { echo 'no fallback warning'; exit 1; }
    cd '$d/serial' && CUDA_VISIBLE_DEVICES=0 '$dpw' train input.json --backend cuda || exit 1
    python3 '$W/compare.py' '$d/serial/lcurve.out' '$d/shared/lcurve.out'"
  if [ "$ngpu" -lt 2 ]; then
    printf 'mpi_2ranks_nccl\tn/a\t0\t-\tskipped: %s GPU (NCCL needs a GPU per rank)\n' "$ngpu" >>"$RESULTS"
    echo "-- mpi_2ranks_nccl: skipped: $ngpu GPU (NCCL needs a GPU per rank)"
    return 0
  fi
  step mpi_2ranks_nccl 150 bash -c "
    cd '$d/nccl' && ${np2[*]} >log 2>&1; rc=\$?; cat log; [ \$rc = 0 ] || exit \$rc
    grep -q 'gradient all-reduce: NCCL' log || { echo 'NCCL was not used'; exit 1; }
    cd '$d/host' && DPW_NCCL=0 ${np2[*]} >log 2>&1 || { cat log; exit 1; }
    python3 '$W/compare.py' '$d/host/lcurve.out' '$d/nccl/lcurve.out'"
}


# The last useful line of a step's log: a test summary, an error, or the last line.
summary_of() {
  local l
  l=$(grep -E '^test result:|lcurve.out|SKIPPED|ERROR SUMMARY|median|s/step|^Error|error:|panicked' "$1" 2>/dev/null |
    grep -v '^\s*$' | tail -1)
  [ -z "$l" ] && l=$(grep -v '^\s*$' "$1" 2>/dev/null | tail -1)
  printf '%s' "${l//$'\t'/ }" | sed 's/\x1b\[[0-9;]*m//g' | tr -d '\r' | cut -c1-300
}

# report.md and report.json under $OUT, and the logs as logs.tar.gz.
report() {
  local fatal=$1
  python3 - "$RESULTS" "$INFO" "$LOGS" "$OUT" "$fatal" <<'EOF'
import glob, json, os, sys, tarfile
results, info, logs, out, fatal = sys.argv[1:6]
steps = []
for line in open(results):
    name, status, secs, rc, detail = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
    steps.append(dict(name=name, status=status, seconds=int(secs), rc=rc, detail=detail))
facts = dict(l.rstrip("\n").split("\t", 1) for l in open(info) if "\t" in l)
bench = []
for f in sorted(glob.glob(f"{logs}/bench_*.json")):
    _, backend, prec, b = os.path.basename(f)[:-5].split("_")
    try:
        j = json.load(open(f))
    except ValueError:
        continue
    prec = {"f64": "float64", "f32": "float32"}.get(j.get("precision", prec), j.get("precision", prec))
    bench.append(dict(backend=backend, precision=prec, batch=int(b[1:]),
                      median_s_per_step=j.get("median_s_per_step"),
                      startup_s=j.get("startup_s"), peak_memory_mb=j.get("peak_memory_mb")))
ok = not fatal and steps and all(s["status"] in ("pass", "n/a") for s in steps)
verdict = "pass" if ok else "fail"
doc = dict(verdict=verdict, fatal=fatal or None, facts=facts, steps=steps, bench=bench)
json.dump(doc, open(f"{out}/report.json", "w"), indent=1)
md = [f"# dpw GPU check: {verdict.upper()}", ""]
if fatal:
    md += [f"**Stopped:** {fatal}", ""]
md += ["| fact | value |", "|---|---|"] + [f"| {k} | `{v}` |" for k, v in facts.items()] + [""]
if steps:
    md += ["| step | status | s | detail |", "|---|---|---|---|"]
    md += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['detail'].replace('|', '/')} |" for s in steps]
    md.append("")
if bench:
    md += ["| backend | precision | batch | median s/step | start-up s |", "|---|---|---|---|---|"]
    md += [f"| {b['backend']} | {b['precision']} | {b['batch']} | {b['median_s_per_step']:.6f} | "
           + ("-" if b["startup_s"] is None else f"{b['startup_s']:.2f}") + " |"
           for b in bench if b["median_s_per_step"] is not None]
    md.append("")
    # The issue's targets: DeePMD-kit PT's s/step over dpw cuda's (>= 10x), wgpu over cuda (<= 3x).
    t = {(b["backend"], b["precision"], b["batch"]): b["median_s_per_step"] for b in bench
         if b["median_s_per_step"]}
    ratios = []
    for prec in ("float64", "float32"):
        for nb in (1, 4, 16):
            cuda = t.get(("cuda", prec, nb))
            for other, what in (("deepmdpt", "DeePMD-kit PT s/step / dpw cuda s/step"),
                                ("deepmdptexpt", "DeePMD-kit PT compiled (pt-expt) s/step / dpw cuda s/step"),
                                ("wgpu", "dpw wgpu s/step / dpw cuda s/step"),
                                ("wgpu-each", "dpw wgpu (a pass per dispatch) s/step / dpw cuda s/step"),
                                ("wgpu-flat", "dpw wgpu (flat dense kernels) s/step / dpw cuda s/step")):
                if cuda and t.get((other, prec, nb)):
                    ratios.append(f"| {what} | {prec} | {nb} | {t[(other, prec, nb)] / cuda:.2f} |")
    # The other models (backend "X+MODEL"): DeePMD-kit over dpw cuda on the same model.
    for (backend, prec, nb), v in sorted(t.items()):
        if "+" in backend and not backend.startswith("cuda+"):
            cuda = t.get(("cuda+" + backend.split("+", 1)[1], prec, nb))
            if cuda:
                ratios.append(f"| {backend} s/step / dpw cuda s/step | {prec} | {nb} | {v / cuda:.2f} |")
    if ratios:
        md += ["| ratio | precision | batch | value |", "|---|---|---|---|"] + ratios + [""]
open(f"{out}/report.md", "w").write("\n".join(md))
with tarfile.open(f"{out}/logs.tar.gz", "w:gz") as t:
    t.add(logs, arcname="logs")
print("\n".join(md))
EOF
}

case "${1:-}" in
  build) (build) ;;
  run) MODE=run run_checks ;;
  more) MODE=more GPU_CHECK_BUDGET=${GPU_CHECK_BUDGET:-200} run_checks ;;
  *)
    echo "usage: scripts/gpu-check.sh build|run|more   (see the comment at its top)" >&2
    exit 2
    ;;
esac
