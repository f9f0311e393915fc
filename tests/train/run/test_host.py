"""host.json: every launch in a run dir notes the host its float results depend on.

The CPU fields come from /proc/cpuinfo's first processor (x86 flags, aarch64 Features) and keep
only the ISA flags kernels are chosen by; a run names one host only when every launch ran there.
"""

import json

from sparrow.cli.config_loader import load_config
from sparrow.train.run.host import (
    FILE_NAME,
    _cpuinfo,
    describe,
    host_fingerprint,
    record_host,
    run_host,
)
from sparrow.train.trainer import GRPOTrainer

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 2
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni amx_tile amx_bf16 rdrand

processor\t: 1
vendor_id\t: AuthenticAMD
flags\t\t: avx
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes sve bf16 i8mm
CPU implementer\t: 0x41
"""


def test_the_cpu_fields_are_the_first_processors_kernel_flags():
    x86 = _cpuinfo(X86)
    assert x86["cpu"] == "GenuineIntel family 6 model 207 stepping 2"
    assert x86["cpu_name"] == "Intel(R) Xeon(R) Processor"
    kernels = ["amx_bf16", "amx_tile", "avx", "avx2", "avx512_vnni", "avx512f", "fma", "sse4_2"]
    assert x86["isa"] == kernels  # fpu, rdrand: no kernel is chosen by them
    assert _cpuinfo(ARM)["isa"] == ["asimd", "bf16", "i8mm", "sve"]


def test_this_hosts_fingerprint_names_its_kernels():
    here = host_fingerprint()
    assert here["threads"] >= 1 and here["torch"] and here["cpu_capability"]
    assert json.loads(json.dumps(here)) == here  # stored as is
    assert here["torch"] in describe(here)


def test_a_run_names_one_host_only_when_every_launch_ran_there(tmp_path):
    a, b = {"cpu": "A"}, {"cpu": "B"}
    assert run_host(tmp_path) is None  # a run older than host.json
    record_host(tmp_path, 0, a)
    record_host(tmp_path, 5, a)
    assert run_host(tmp_path) == a
    record_host(tmp_path, 9, b)
    assert run_host(tmp_path) is None
    launches = json.loads((tmp_path / FILE_NAME).read_text())["launches"]
    assert [launch["from_step"] for launch in launches] == [0, 5, 9]


def test_the_trainer_writes_each_launchs_host(tmp_path):
    tiny = ["preset=tiny", "rl.eval.every=0", "rl.save_every=1", f"run_dir={tmp_path}"]
    GRPOTrainer.from_config(load_config([*tiny, "rl.steps=1"])).fit()
    assert run_host(tmp_path) == host_fingerprint()
    GRPOTrainer.from_config(load_config([*tiny, "rl.steps=2"])).fit()  # resumes at step 1
    launches = json.loads((tmp_path / FILE_NAME).read_text())["launches"]
    assert [launch["from_step"] for launch in launches] == [0, 1]
