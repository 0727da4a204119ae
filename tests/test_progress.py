"""Progress lines appear on a terminal and nowhere else."""
import io

from harness.base.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_writes_only_to_a_terminal():
    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        p = Progress("run", stream=stream)
        p.update("step 1", force=True)
        p.update("step 2")  # throttled: within every_s of the last line
        p.done()
    assert "run: step 1" in tty.getvalue() and "step 2" not in tty.getvalue()
    assert pipe.getvalue() == ""
