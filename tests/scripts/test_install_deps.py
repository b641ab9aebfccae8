"""scripts/install-deps.sh names a disk too full for the PyTorch wheel before pip starts.

A CI run once died in pip with "OSError: [Errno 28] No space left on device" half way through the
wheel; the script now checks the room first. df and dpkg-query are replaced on PATH so the test
runs the real script without touching the machine: dpkg-query says every Debian package is
there, df says the disk has 280 MiB free, and the venv does not exist, so the script reaches the
PyTorch step and must stop there, before making the venv.
"""
import os
import pathlib
import stat
import subprocess
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _tool(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


class InstallDepsDiskCheckTest(unittest.TestCase):
    def run_script(self, free_kib):
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="install_deps_test."))
        self.addCleanup(subprocess.run, ["rm", "-rf", str(tmp)])
        fake = tmp / "bin"
        fake.mkdir()
        _tool(fake, "dpkg-query", 'printf "install ok installed"\n')
        _tool(fake, "df", 'echo "Filesystem 1024-blocks Used Available Capacity Mounted on"\n'
                          f'echo "/dev/x 1000000000 1 {free_kib} 99% /"\n')
        venv = tmp / "parent" / "venv"
        env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OURGPIPE_VENV=str(venv),
                   TMPDIR=str(tmp), OURGPIPE_NO_TORCH="0")
        env.pop("CI", None)  # CI as root would add slurm packages; the fake dpkg-query covers them anyway
        proc = subprocess.run([str(ROOT / "scripts/install-deps.sh")], env=env, capture_output=True,
                              text=True, timeout=60)
        return proc, venv

    def test_full_disk_is_named_before_pip(self):
        proc, venv = self.run_script(free_kib=280 * 1024)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("has 280 MiB free", proc.stderr)
        self.assertIn("needs about 9 GiB", proc.stderr)
        self.assertIn("OURGPIPE_VENV", proc.stderr)  # says where else it could go
        self.assertNotIn("installing PyTorch", proc.stdout)
        self.assertFalse(venv.exists(), "the venv was made although the disk check failed")


if __name__ == "__main__":
    unittest.main()
