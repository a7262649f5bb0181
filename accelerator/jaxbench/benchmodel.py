"""`make bench-model`: recmesh's compiled DCNv2 against JAX's, per bucket and
dense precision, on one core.

--bundle names one bundle per dense precision (config.json's dense_dtype:
fp32, or the fp16 and bf16 halves, whose values are their exact widenings
to float32; the math is float32 at every precision), as a list of
PRECISION=DIR (fp32=DIR,fp16=DIR,bf16=DIR) or of plain directories, whose
precision config.json gives. Every round runs, per precision, one after
the other and each pinned to the same core (taskset -c CPU):

  1. `accelerator bench` (recmesh's StableHLO program on the PJRT plugin;
     it reads the bundle's dense precision itself),
  2. jaxbench.py --backend plugin (JAX's program on the same plugin, its
     client configured as the accelerator configures its own: the
     cpu_device_count and PJRT_NPROC it reports), the weights in the
     bundle's precision (--dense-compute half: half weights on the device,
     float32 math, as a JAX engineer writes it; bench/python/dlrm.py's
     HALF_PLAN has the formulations and their figures),
  3. for a half precision, jaxbench.py --backend plugin --dense-compute
     fp32: the same model with its weights widened to float32 at load,
     JAX's float32 program (for fp32 it is arm 2 itself),
  4. jaxbench.py --backend builtin (JAX's program on jaxlib's CPU backend,
     weights in the bundle's precision),

so that a slow spell of a shared machine hits every arm alike. Rounds
interleave the arms, and every other round runs them in the reverse order,
so that neither the PJRT arm nor JAX's always runs first after a pause. The
printed throughputs are medians over rounds, with the range beside them;
ratio is the median over rounds of that round's examples_per_s /
jax_examples_per_s, a paired comparison: the machine's speed drifts by
minutes (threefold within an hour on the shared 2-core VM this was written
on), and the two arms of one round run back to back, so the drift cancels
in their ratio where it would not in a ratio of medians. fp32_ratio is the
same against JAX's float32 program, builtin_ratio against jaxlib's backend.
On a CPU, JAX's half program beats its float32 one at small buckets and
loses to it at large ones (dlrm.py's figures): recmesh at a half precision
is ahead of JAX only where it beats both, the smaller of ratio and
fp32_ratio.

Then, per precision, `accelerator hlobench` times the two programs alone:
the StableHLO the accelerator compiles and the one JAX lowered (written by
round 1's arms), both compiled and run by the accelerator's runtime in one
process, alternating, for twice as many rounds of half the time;
program_ratio is the median over those rounds of recmesh's calls/s over
JAX's. Where ratio and program_ratio part, the difference is in the
runtimes, not the programs. hlobench gives each argument the type the
program declares, so at a half precision both programs take half weights
(recmesh's its f16 or bf16, JAX's float16, or uint16 holding bf16's bits)
as they do in their runtimes. Should hlobench still fail on a program,
program_ratio is na, with a line saying why (ratio, measured in the two
runtimes, still compares the two); at fp32 the bench fails. The last
lines are, per bucket and precision,

  model: bucket=<b> dense_dtype=<d> examples_per_s=<x> jax_examples_per_s=<y>
      jax_fp32_examples_per_s=<f> ratio=<x/y, paired> fp32_ratio=<x/f, paired>
      jax_builtin_examples_per_s=<z> builtin_ratio=<x/z, paired> range=...
      jax_range=... jax_fp32_range=... jax_builtin_range=... rounds=<n>
      platform=<cpu|cuda> jax_backend=<plugin|builtin>
      [jax_default_examples_per_s=...] program_ratio=<r|na>

(one line each). Usage (the Makefile fills these in; one bundle works as
before):

  python benchmodel.py --accelerator bin/accelerator \
      --bundle fp32=data/dlrm-cap1000,fp16=data/dlrm-cap1000-dense-fp16,bf16=data/dlrm-cap1000-dense-bf16 \
      --cpu 0 --buckets 1,16,128 --rounds 3 --duration 1
"""

import argparse
import json
import os
import re
import statistics
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIELD = re.compile(r"(\w+)=(\"[^\"]*\"|\S+)")
PRECISIONS = ("fp32", "fp16", "bf16")


def fields(line):
    return {k: v.strip('"') for k, v in FIELD.findall(line)}


def run(cmd, env=None, echo=False, may_fail=False, quiet=False):
    """cmd's stdout; None when it fails and may_fail (its stderr's tail
    echoed unless quiet; the last line kept in run.last_error)."""
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        run.last_error = lines[-1] if lines else f"exit status {p.returncode}"
        if not quiet:
            sys.stderr.write(p.stderr[-4000:])
        if may_fail:
            return None
        raise SystemExit(f"bench-model: {' '.join(cmd)} exited {p.returncode}")
    if echo:
        for line in p.stdout.splitlines():
            if not re.match(r"model: bucket=", line):
                print(line, flush=True)
    return p.stdout


run.last_error = ""


def per_bucket(out, prefix):
    """{bucket: examples_per_s} from the lines of out starting with prefix
    that have a bucket."""
    got = {}
    for line in out.splitlines():
        if line.startswith(prefix) and "bucket=" in line:
            f = fields(line)
            got[int(f["bucket"])] = float(f["examples_per_s"])
    return got


def bundle_precision(directory):
    """The dense precision a bundle's config.json gives (absent: fp32)."""
    with open(os.path.join(directory, "config.json")) as f:
        dtype = json.load(f).get("dense_dtype") or "fp32"
    if dtype not in PRECISIONS:
        raise SystemExit(f"bench-model: {directory}: dense_dtype {dtype!r} is not one of {', '.join(PRECISIONS)}")
    return dtype


def parse_bundles(spec):
    """[(precision, directory)] from --bundle: a comma-separated list of
    PRECISION=DIR or DIR (its precision from its config.json), at most one
    per precision, in precision order (fp32, fp16, bf16)."""
    got = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        label, sep, directory = item.partition("=")
        if not sep or label not in PRECISIONS:
            label, directory = None, item
        said = bundle_precision(directory)
        if label is not None and label != said:
            raise SystemExit(f"bench-model: --bundle {item}: its config.json says dense_dtype {said}, not {label}")
        if said in got:
            raise SystemExit(f"bench-model: --bundle: two {said} bundles ({got[said]}, {directory})")
        got[said] = directory
    if not got:
        raise SystemExit("bench-model: --bundle names no bundle")
    return [(d, got[d]) for d in PRECISIONS if d in got]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accelerator", required=True, help="the accelerator binary")
    ap.add_argument("--bundle", required=True,
                    help="one bundle per dense precision: fp32=DIR,fp16=DIR,bf16=DIR, or directories whose "
                         "config.json gives their dense_dtype (one directory: as before)")
    ap.add_argument("--cpu", default="0", help="the core (taskset -c list) every arm runs on")
    ap.add_argument("--buckets", default="1,16,128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1.0, help="seconds per bucket per arm per round")
    ap.add_argument("--plugin", default=os.environ.get("RECMESH_PJRT_PLUGIN", ""))
    ap.add_argument("--python", default=sys.executable, help="the Python with jax (the bench venv)")
    ap.add_argument("--jax-default-client", action="store_true",
                    help="also time JAX's program on the plugin with JAX's default client "
                         "options (the plugin's 4 CPU devices), as jax_default_examples_per_s")
    ap.add_argument("--platform", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: the plugin is the CPU plugin, the yardstick jaxlib's CPU backend; cuda: the plugin "
                         "is a CUDA plugin and the yardstick JAX's own CUDA backend (the GPU pack's run.sh)")
    args = ap.parse_args(argv)
    buckets = [int(b) for b in args.buckets.split(",")]
    if not args.plugin:
        ap.error("--plugin or RECMESH_PJRT_PLUGIN is required")
    bundles = parse_bundles(args.bundle)
    pin = ["taskset", "-c", args.cpu]

    def jaxbench(bundle, compute):
        return [args.python, os.path.join(HERE, "jaxbench.py"), "--bundle", bundle,
                "--buckets", args.buckets, "--duration", str(args.duration), "--plugin", args.plugin,
                "--builtin-platform", args.platform, "--dense-compute", compute]

    # On a GPU, JAX may refuse to drive our plugin (its PJRT C API is older
    # than jaxlib's): JAX on its own CUDA backend is then the yardstick.
    jax_on_plugin = True

    # arms[precision][arm]: one {bucket: examples/s} per round.
    arm_names = ("pjrt", "jax", "jax_fp32", "builtin", "jax_default")
    arms = {d: {a: [] for a in arm_names} for d, _ in bundles}
    # JAX's client on the plugin gets the settings the accelerator gave its
    # own (read from its header), so the ratio compares programs, not
    # thread pools.
    header = {}

    # Round 1 also writes the StableHLO of both programs, for hlobench.
    dumps = tempfile.mkdtemp(prefix="bench-model-")
    dump = {(d, name): os.path.join(dumps, d, name) for d, _ in bundles for name in ("recmesh", "jax", "builtin")}

    def plugin_env():
        env = dict(os.environ)
        opts = []
        if header.get("xla_threads"):
            env["PJRT_NPROC"] = header["xla_threads"]
        if header.get("cpu_device_count"):
            opts = ["--plugin-option", "cpu_device_count=" + header["cpu_device_count"]]
        return env, opts

    def time_pjrt(d, bundle, echo):
        out = run(pin + [args.accelerator, "bench", "--bundle", bundle, "--buckets", args.buckets,
                         "--duration", f"{args.duration}s"] + (["--dump-program", dump[d, "recmesh"]] if echo else []),
                  echo=echo)
        for line in out.splitlines():
            if line.startswith("model: ") and "bucket=" not in line:
                header.update(fields(line))
        arms[d]["pjrt"].append(per_bucket(out, "model: "))

    def time_jax(d, bundle, echo):
        nonlocal jax_on_plugin
        env, opts = plugin_env()
        if jax_on_plugin:
            out = run(pin + jaxbench(bundle, "half") + ["--backend", "plugin"] + opts
                      + (["--dump-stablehlo", dump[d, "jax"]] if echo else []), env=env, echo=echo,
                      may_fail=args.platform != "cpu")
            if out is None:
                jax_on_plugin = False
                print("model: JAX cannot run our plugin here; jax_examples_per_s and jax_fp32_examples_per_s "
                      f"are JAX's own {args.platform} backend", flush=True)
            else:
                arms[d]["jax"].append(per_bucket(out, "jax: "))

    def time_jax_fp32(d, bundle, echo):
        # JAX's float32 program on the same model: the bundle's weights
        # widened at load. For fp32 it is time_jax's measurement.
        if d == "fp32":
            return
        if jax_on_plugin:
            env, opts = plugin_env()
            out = run(pin + jaxbench(bundle, "fp32") + ["--backend", "plugin"] + opts, env=env, echo=echo)
        else:
            out = run(pin + jaxbench(bundle, "fp32") + ["--backend", "builtin"], echo=echo)
        arms[d]["jax_fp32"].append(per_bucket(out, "jax: "))

    def time_builtin(d, bundle, echo):
        out = run(pin + jaxbench(bundle, "half") + ["--backend", "builtin"]
                  + (["--dump-stablehlo", dump[d, "builtin"]] if echo else []), echo=echo)
        arms[d]["builtin"].append(per_bucket(out, "jax: "))

    def time_default(d, bundle, echo):
        out = run(pin + jaxbench(bundle, "half") + ["--backend", "plugin"])
        arms[d]["jax_default"].append(per_bucket(out, "jax: "))

    for r in range(args.rounds):
        order = [(d, bundle, timer) for d, bundle in bundles
                 for timer in [time_pjrt, time_jax, time_jax_fp32, time_builtin]
                 + ([time_default] if args.jax_default_client else [])]
        if r % 2 == 1 and header:
            order.reverse()  # the header (the PJRT arm's settings) is known after round 1
        for d, bundle, timer in order:
            timer(d, bundle, echo=(r == 0))
        for d, _ in bundles:
            a = arms[d]
            if not jax_on_plugin:
                a["jax"] = list(a["builtin"])
            if d == "fp32":
                a["jax_fp32"] = list(a["jax"])
            print(f"model: round={r + 1}/{args.rounds} dense_dtype={d} " + " ".join(
                f"b{b}={a['pjrt'][-1][b]:.0f}/{a['jax'][-1][b]:.0f}/{a['jax_fp32'][-1][b]:.0f}/{a['builtin'][-1][b]:.0f}"
                for b in buckets) + " (pjrt/jax/jax_fp32/jax_builtin examples/s)", flush=True)

    # The programs themselves, with everything else held equal: recmesh's
    # and JAX's StableHLO compiled and run by the accelerator's runtime, in
    # one process, alternating, as many rounds as above; per precision.
    hlo = {}  # precision -> round -> program file -> calls/s (absent: hlobench could not run them)
    for d, _ in bundles:
        jax_dir = dump[d, "jax"] if jax_on_plugin else dump[d, "builtin"]
        programs = []
        for b in buckets:
            programs += [os.path.join(dump[d, "recmesh"], f"recmesh_b{b}.mlir"), os.path.join(jax_dir, f"jax_b{b}.mlir")]
        # Twice the rounds at half the time each: the same seconds, and twice
        # the pairs to take the median of (a 4-round median still moved by
        # ±10 % between runs).
        hlo_cmd = pin + [args.accelerator, "hlobench", "--rounds", str(2 * args.rounds),
                         "--duration", f"{args.duration / 2}s"]
        for prog in programs:
            hlo_cmd += ["--program", prog]
        out = run(hlo_cmd, echo=True, may_fail=d != "fp32")
        if out is None:
            print(f"model: dense_dtype={d}: hlobench cannot run these programs ({run.last_error.strip()[:300]}); "
                  "program_ratio=na", flush=True)
            continue
        rounds = hlo.setdefault(d, {})
        for line in out.splitlines():
            f = fields(line)
            if line.startswith("hlo: round="):
                rounds.setdefault(f["round"], {})[f["program"]] = float(f["calls_per_s"])
    shutil.rmtree(dumps, ignore_errors=True)

    def program_ratio(d, b):
        """The median over hlobench's rounds of recmesh's program's calls/s
        over JAX's, at bucket b ("na" where hlobench could not run them)."""
        if d not in hlo:
            return "na"
        return f"{statistics.median(r[f'recmesh_b{b}.mlir'] / r[f'jax_b{b}.mlir'] for r in hlo[d].values()):.2f}"

    for d, _ in bundles:
        a = arms[d]

        def med(arm, b):
            return statistics.median(run_[b] for run_ in a[arm])

        def rng(arm, b):
            v = [run_[b] for run_ in a[arm]]
            return f"{min(v):.0f}-{max(v):.0f}"

        def paired(arm, b):
            """The median over rounds of the round's PJRT / arm ratio."""
            return statistics.median(p[b] / o[b] for p, o in zip(a["pjrt"], a[arm]))

        for b in buckets:
            x, y, f32, z = med("pjrt", b), med("jax", b), med("jax_fp32", b), med("builtin", b)
            line = (f"model: bucket={b} dense_dtype={d} examples_per_s={x:.0f} jax_examples_per_s={y:.0f} "
                    f"jax_fp32_examples_per_s={f32:.0f} ratio={paired('jax', b):.2f} "
                    f"fp32_ratio={paired('jax_fp32', b):.2f} "
                    f"jax_builtin_examples_per_s={z:.0f} builtin_ratio={paired('builtin', b):.2f} "
                    f"range={rng('pjrt', b)} jax_range={rng('jax', b)} jax_fp32_range={rng('jax_fp32', b)} "
                    f"jax_builtin_range={rng('builtin', b)} "
                    f"rounds={args.rounds} platform={args.platform} jax_backend={'plugin' if jax_on_plugin else 'builtin'}")
            if a["jax_default"]:
                line += f" jax_default_examples_per_s={med('jax_default', b):.0f}"
            line += f" program_ratio={program_ratio(d, b)}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
