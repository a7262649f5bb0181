"""`make bench-model`: recmesh's compiled DCNv2 against JAX's, per bucket,
on one core.

Every round runs, one after the other and each pinned to the same core
(taskset -c CPU):

  1. `accelerator bench` (recmesh's StableHLO program on the PJRT plugin),
  2. jaxbench.py --backend plugin (JAX's program on the same plugin, its
     client configured as the accelerator configures its own: the
     cpu_device_count and PJRT_NPROC it reports),
  3. jaxbench.py --backend builtin (JAX's program on jaxlib's CPU backend),

so that a slow spell of a shared machine hits every arm alike. Rounds
interleave the arms, and every other round runs them in the reverse order,
so that neither the PJRT arm nor JAX's always runs first after a pause. The
printed throughputs are medians over rounds, with the range beside them;
ratio is the median over rounds of that round's examples_per_s /
jax_examples_per_s, a paired comparison: the machine's speed drifts by
minutes (threefold within an hour on the shared 2-core VM this was written
on), and the two arms of one round run back to back, so the drift cancels
in their ratio where it would not in a ratio of medians.

Then `accelerator hlobench` times the two programs alone: the StableHLO the
accelerator compiles and the one JAX lowered (written by round 1's arms),
both compiled and run by the accelerator's runtime in one process,
alternating, for twice as many rounds of half the time; program_ratio is
the median over those rounds of recmesh's calls/s over JAX's. Where ratio and program_ratio part,
the difference is in the runtimes, not the programs. The last lines are

  model: bucket=<b> examples_per_s=<x> jax_examples_per_s=<y> ratio=<x/y, paired> jax_builtin_examples_per_s=<z> ...

Usage (the Makefile fills these in):

  python benchmodel.py --accelerator bin/accelerator --bundle data/dlrm-cap1000 \
      --cpu 0 --buckets 1,16,128 --rounds 3 --duration 1
"""

import argparse
import os
import re
import statistics
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIELD = re.compile(r"(\w+)=(\"[^\"]*\"|\S+)")


def fields(line):
    return {k: v.strip('"') for k, v in FIELD.findall(line)}


def run(cmd, env=None, echo=False, may_fail=False):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        if may_fail:
            return None
        raise SystemExit(f"bench-model: {' '.join(cmd)} exited {p.returncode}")
    if echo:
        for line in p.stdout.splitlines():
            if not re.match(r"model: bucket=", line):
                print(line, flush=True)
    return p.stdout


def per_bucket(out, prefix):
    """{bucket: examples_per_s} from the lines of out starting with prefix
    that have a bucket."""
    got = {}
    for line in out.splitlines():
        if line.startswith(prefix) and "bucket=" in line:
            f = fields(line)
            got[int(f["bucket"])] = float(f["examples_per_s"])
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accelerator", required=True, help="the accelerator binary")
    ap.add_argument("--bundle", required=True)
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
    pin = ["taskset", "-c", args.cpu]
    jaxbench = [args.python, os.path.join(HERE, "jaxbench.py"), "--bundle", args.bundle,
                "--buckets", args.buckets, "--duration", str(args.duration), "--plugin", args.plugin,
                "--builtin-platform", args.platform]
    # On a GPU, JAX may refuse to drive our plugin (its PJRT C API is older
    # than jaxlib's): JAX on its own CUDA backend is then the yardstick.
    jax_on_plugin = True

    arms = {"pjrt": [], "jax": [], "builtin": [], "jax_default": []}
    # JAX's client on the plugin gets the settings the accelerator gave its
    # own (read from its header), so the ratio compares programs, not
    # thread pools.
    header = {}

    # Round 1 also writes the StableHLO of both programs, for hlobench.
    dumps = tempfile.mkdtemp(prefix="bench-model-")
    dump = {name: os.path.join(dumps, name) for name in ("recmesh", "jax", "builtin")}

    def time_pjrt(echo):
        out = run(pin + [args.accelerator, "bench", "--bundle", args.bundle, "--buckets", args.buckets,
                         "--duration", f"{args.duration}s"] + (["--dump-program", dump["recmesh"]] if echo else []),
                  echo=echo)
        for line in out.splitlines():
            if line.startswith("model: ") and "bucket=" not in line:
                header.update(fields(line))
        arms["pjrt"].append(per_bucket(out, "model: "))

    def time_jax(echo):
        nonlocal jax_on_plugin
        env = dict(os.environ)
        opts = []
        if header.get("xla_threads"):
            env["PJRT_NPROC"] = header["xla_threads"]
        if header.get("cpu_device_count"):
            opts = ["--plugin-option", "cpu_device_count=" + header["cpu_device_count"]]
        if jax_on_plugin:
            out = run(pin + jaxbench + ["--backend", "plugin"] + opts
                      + (["--dump-stablehlo", dump["jax"]] if echo else []), env=env, echo=echo,
                      may_fail=args.platform != "cpu")
            if out is None:
                jax_on_plugin = False
                print("model: JAX cannot run our plugin here; jax_examples_per_s is JAX's own "
                      f"{args.platform} backend", flush=True)
            else:
                arms["jax"].append(per_bucket(out, "jax: "))

    def time_builtin(echo):
        out = run(pin + jaxbench + ["--backend", "builtin"]
                  + (["--dump-stablehlo", dump["builtin"]] if echo else []), echo=echo)
        arms["builtin"].append(per_bucket(out, "jax: "))

    def time_default(echo):
        out = run(pin + jaxbench + ["--backend", "plugin"])
        arms["jax_default"].append(per_bucket(out, "jax: "))

    for r in range(args.rounds):
        order = [time_pjrt, time_jax, time_builtin] + ([time_default] if args.jax_default_client else [])
        if r % 2 == 1 and header:
            order.reverse()  # the header (the PJRT arm's settings) is known after round 1
        for timer in order:
            timer(echo=(r == 0))
        if not jax_on_plugin:
            arms["jax"] = list(arms["builtin"])
        print(f"model: round={r + 1}/{args.rounds} " + " ".join(
            f"b{b}={arms['pjrt'][-1][b]:.0f}/{arms['jax'][-1][b]:.0f}/{arms['builtin'][-1][b]:.0f}" for b in buckets)
            + " (pjrt/jax/jax_builtin examples/s)", flush=True)

    # The programs themselves, with everything else held equal: recmesh's
    # and JAX's StableHLO compiled and run by the accelerator's runtime, in
    # one process, alternating, as many rounds as above.
    jax_dir = dump["jax"] if jax_on_plugin else dump["builtin"]
    programs = []
    for b in buckets:
        programs += [os.path.join(dump["recmesh"], f"recmesh_b{b}.mlir"), os.path.join(jax_dir, f"jax_b{b}.mlir")]
    # Twice the rounds at half the time each: the same seconds, and twice
    # the pairs to take the median of (a 4-round median still moved by
    # ±10 % between runs).
    hlo_cmd = pin + [args.accelerator, "hlobench", "--rounds", str(2 * args.rounds),
                     "--duration", f"{args.duration / 2}s"]
    for prog in programs:
        hlo_cmd += ["--program", prog]
    out = run(hlo_cmd, echo=True)
    shutil.rmtree(dumps, ignore_errors=True)
    hlo = {}  # round -> program file -> calls/s
    for line in out.splitlines():
        f = fields(line)
        if line.startswith("hlo: round="):
            hlo.setdefault(f["round"], {})[f["program"]] = float(f["calls_per_s"])

    def program_ratio(b):
        """The median over hlobench's rounds of recmesh's program's calls/s
        over JAX's, at bucket b."""
        return statistics.median(r[f"recmesh_b{b}.mlir"] / r[f"jax_b{b}.mlir"] for r in hlo.values())

    def med(arm, b):
        return statistics.median(run_[b] for run_ in arms[arm])

    def rng(arm, b):
        v = [run_[b] for run_ in arms[arm]]
        return f"{min(v):.0f}-{max(v):.0f}"

    def paired(arm, b):
        """The median over rounds of the round's PJRT / arm ratio."""
        return statistics.median(p[b] / o[b] for p, o in zip(arms["pjrt"], arms[arm]))

    for b in buckets:
        x, y, z = med("pjrt", b), med("jax", b), med("builtin", b)
        line = (f"model: bucket={b} examples_per_s={x:.0f} jax_examples_per_s={y:.0f} ratio={paired('jax', b):.2f} "
                f"jax_builtin_examples_per_s={z:.0f} builtin_ratio={paired('builtin', b):.2f} "
                f"range={rng('pjrt', b)} jax_range={rng('jax', b)} jax_builtin_range={rng('builtin', b)} "
                f"rounds={args.rounds} platform={args.platform} jax_backend={'plugin' if jax_on_plugin else 'builtin'}")
        if arms["jax_default"]:
            line += f" jax_default_examples_per_s={med('jax_default', b):.0f}"
        line += f" program_ratio={program_ratio(b):.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
