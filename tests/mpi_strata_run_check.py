#!/usr/bin/env python3
"""Checks launch/strata-run without starting anything (--print): the rank count it derives from a
config (and from --set overrides), the mpirun flags it adds, and its exit status 2 with one
`error:` line naming both numbers on a rank count that does not match.

Usage: mpi_strata_run_check.py PATH/TO/strata-run
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile

script = sys.argv[1]
failures = []


def run(args, env_extra=None):
    # 64 cores unless a check says otherwise: the flags must not depend on the machine's.
    env = dict(os.environ, STRATA_BIN="/opt/strata/bin/strata", MPIRUN="mpirun",
               STRATA_RUN_CORES="64")
    env.pop("SLURM_JOB_ID", None)
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, script] + args, capture_output=True, text=True, env=env)
    return r.returncode, r.stdout.strip(), r.stderr.strip()


def check(name, cond, detail):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else ": " + detail))
    if not cond:
        failures.append(name)


with tempfile.TemporaryDirectory() as tmp:
    cfg = os.path.join(tmp, "cfg.json")
    with open(cfg, "w") as f:
        json.dump({"parallel": {"tensor": 2, "pipeline": 2, "data": 2}}, f)
    nodata = os.path.join(tmp, "nodata.json")
    with open(nodata, "w") as f:
        json.dump({"parallel": {"tensor": 2, "pipeline": 3, "data": None}}, f)
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write('{"parallel": {"tensor": 2,, }}')

    rc, out, err = run(["--print", "--config", cfg, "--set", "train.iterations=3", "--dry-run"])
    argv = shlex.split(out)
    check("t*p*d ranks", rc == 0 and argv[argv.index("-np") + 1] == "8", out + err)
    tail = argv[argv.index("-np") + 2:]
    check("exec strata train with the rest",
          tail == ["/opt/strata/bin/strata", "train", "--config", cfg, "--set",
                   "train.iterations=3", "--dry-run"], out)
    check("binding", "--bind-to" in argv and argv[argv.index("--bind-to") + 1] == "core", out)
    if os.geteuid() == 0:
        check("root in containers", "--allow-run-as-root" in argv, out)

    check("no oversubscription where the cores suffice", "--oversubscribe" not in argv, out)

    rc, out, err = run(["--print", "--config", cfg, "--set", "parallel.context=2"])
    argv = shlex.split(out)
    check("context ranks count", rc == 0 and argv[argv.index("-np") + 1] == "16", out + err)
    rc, out, err = run(["--print", "--np", "8", "--config", cfg, "--set", "parallel.context=2"])
    check("--np against tensor x context x pipeline x data",
          rc == 2 and "tensor x context x pipeline x data = 2 x 2 x 2 x 2 = 16" in err, err)

    rc, out, err = run(["--print", "--config", cfg], {"STRATA_RUN_CORES": "2"})
    argv = shlex.split(out)
    check("more ranks than cores oversubscribe, unbound",
          rc == 0 and "--oversubscribe" in argv and argv[argv.index("--bind-to") + 1] == "none",
          out + err)
    check("and say so", "8 ranks on 2 cores: oversubscribing" in err, err)
    rc, out, err = run(["--print", "--hostfile", "hosts", "--config", cfg],
                       {"STRATA_RUN_CORES": "2"})
    check("a hostfile's slots are mpirun's to count", "--oversubscribe" not in shlex.split(out),
          out)

    rc, out, err = run(["--print", "--oversubscribe", "--config", cfg, "--set=parallel.pipeline=4"])
    argv = shlex.split(out)
    check("--set overrides the file", rc == 0 and argv[argv.index("-np") + 1] == "16", out + err)
    check("oversubscribe turns binding off",
          "--oversubscribe" in argv and argv[argv.index("--bind-to") + 1] == "none", out)

    rc, out, err = run(["--print", "--config", nodata])
    argv = shlex.split(out)
    check("data null counts as 1", rc == 0 and argv[argv.index("-np") + 1] == "6", out + err)
    rc, out, err = run(["--print", "--np", "12", "--config", nodata])
    check("--np with data null", rc == 0 and "-np 12" in out, out + err)

    rc, out, err = run(["--print", "--np", "4", "--config", cfg])
    check("--np mismatch exits 2 naming both numbers",
          rc == 2 and err.startswith("error: " + cfg + ": parallel:") and "8" in err
          and "4" in err and "\n" not in err, "rc %d: %s" % (rc, err))
    rc, out, err = run(["--print", "--config", bad])
    check("bad JSON exits 2 with a byte offset",
          rc == 2 and err.startswith("error: " + bad + ": byte "), "rc %d: %s" % (rc, err))
    rc, out, err = run(["--print", "--config", os.path.join(tmp, "missing.json")])
    check("missing config exits 2", rc == 2 and err.startswith("error: "), "rc %d: %s" % (rc, err))
    rc, out, err = run(["--print", "--set", "parallel.tensor=0", "--config", cfg])
    check("non-positive size exits 2", rc == 2 and "parallel.tensor" in err, "rc %d: %s" % (rc, err))
    rc, out, err = run(["--print"])
    check("--config required", rc == 2 and "--config" in err, "rc %d: %s" % (rc, err))

sys.exit(1 if failures else 0)
