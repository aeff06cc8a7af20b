"""``python -m genrec``: the ``genrec`` command line (:mod:`genrec.cli`)."""

from genrec.cli import app

if __name__ == "__main__":
    app(prog_name="genrec")
