"""pycaffe's log (caffe8.pylog) as BVLC's: glog lines on file descriptor 2 itself, so a notebook,
whose sys.stderr shows in its cells, does not fill with them; GLOG_minloglevel honoured, and
``caffe.init_log()`` keeps it (only ``init_log(level)`` changes it)."""
import subprocess
import sys
import textwrap

NET = 'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 } } }'

# what a notebook kernel does: sys.stderr is an object of its own, shown in the cell
PROGRAM = textwrap.dedent('''
    import io, sys
    cell = io.StringIO()
    sys.stderr = cell
    import caffe8 as caffe
    {before}
    open("net.prototxt", "w").write({net!r})
    caffe.Net("net.prototxt", caffe.TEST)
    caffe.log("said by caffe.log")
    sys.__stdout__.write("CELL:" + repr(cell.getvalue()) + "\\n")
''')


def run(tmp_path, before="", env_level=None):
    env = {"PATH": "/usr/bin:/bin"}
    if env_level is not None:
        env["GLOG_minloglevel"] = env_level
    code = PROGRAM.format(before=before, net=NET)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cell = out.stdout.split("CELL:", 1)[1]
    return cell, out.stderr  # out.stderr: what reached file descriptor 2


def test_the_log_goes_to_fd_2_not_to_a_notebook_cell(tmp_path):
    cell, fd2 = run(tmp_path)
    assert cell.strip() == "''"
    assert "Initializing net from parameters" in fd2 and "Network initialization done." in fd2
    assert "] said by caffe.log" in fd2
    assert all(line[0] in "IWE" for line in fd2.splitlines())


def test_glog_minloglevel_silences_it_and_init_log_without_a_level_keeps_that(tmp_path):
    _, fd2 = run(tmp_path, env_level="1")
    assert fd2 == ""
    _, fd2 = run(tmp_path, before="caffe.init_log()", env_level="1")  # BVLC's InitLog()
    assert fd2 == ""
    _, fd2 = run(tmp_path, before="caffe.init_log(0)", env_level="1")  # InitLogLevel(0)
    assert "Network initialization done." in fd2
    _, fd2 = run(tmp_path, before="caffe.init_log(1)")
    assert fd2 == ""
