"""A net file that cannot be read (mode 000, for a user without CAP_DAC_OVERRIDE): ``caffe8
train`` ends with one error line naming the file, no traceback (wiring's look for the bundled
digits data opened the file first and let PermissionError through). The suite runs as root,
which reads mode 000, so the refusal is made by ``open`` itself for that one path."""
import builtins
import os

from caffe8.cli import main

SOLVER = 'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\n'
NET = 'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 } } }\n'


def test_an_unreadable_net_file_is_one_error_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    net.chmod(0)
    real_open = builtins.open

    def open_as_a_user(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.abspath(file) == str(net):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", open_as_a_user)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "-solver", "solver.prototxt"]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("caffe8: error: ") and "net.prototxt" in errors[0]
    assert "Permission denied" in errors[0]
