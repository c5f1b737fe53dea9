"""Build the topic task of the long-range benchmark (``benchmarks/bench_long_range.py``): which part of the
Python standard library a window of source code comes from, in the spirit of Long Range Arena's text
classification (a document-level label whose evidence is spread through the text).

Nothing is downloaded: the files are the standard library of the interpreter that runs the script
(CPython 3.11.7 here; PSF licence, see ``LICENSE.md``)::

    python benchmarks/data/long_range/build_topic_data.py      # writes topic.json.gz next to it

Options: ``--stdlib DIR`` (default: this interpreter's, ``sysconfig.get_paths()["stdlib"]``), ``--output FILE``
(default ``topic.json.gz`` next to this script), ``--seed`` (default 0). The output is a function of the
standard library and the seed: running it twice gives the same bytes.

1. **Groups.** A file's group is the first of ``GROUPS`` with a pattern (``fnmatch``, on its path relative to the
   standard library; ``*`` also matches ``/``) that its path matches: a package or a set of modules about one
   topic, with their tests (``test/test_email/*`` is ``email``). Files of no group are left out.
2. **Bodies.** A grouped ``*.py`` file is kept when it is UTF-8, parses (``ast``), does not repeat an earlier
   file's text, and its body holds at least ``MIN_BODY_TOKENS`` tokens (T = 1024's window). The body starts
   at the first line of the first top-level statement that is not part of the header (:func:`is_header`: the
   module docstring, imports, dunder assignments such as ``__all__``; a decorated statement starts at its first
   decorator): the licence comments, the docstring that names the module and the imports never reach an
   example. Tokens are the retrieval data's (``build_retrieval_data.TOKEN``); a body keeps its first
   ``BODY_TOKENS``.
3. **Splits**, by file, within each group and within its long bodies (at least ``LONG_BODY_TOKENS``, T = 4096's
   window) and its others apart (``build_retrieval_data.split_documents`` on each, one shared
   ``random.Random(seed)``): its ``TEST_SHARE`` (0.2) of them to test, ``VALIDATION_SHARE`` (0.2) to validation,
   the rest to train, so that every split holds every group at T = 1024 and at T = 4096; no file is in two splits.
4. ``topic.json.gz`` (gzip without a timestamp or file name): ``groups`` (names, a label is an index into it),
   ``patterns`` (per group), ``files`` (``path``, ``group``, ``tokens``: the whole body's count, ``body``: its
   first ``BODY_TOKENS`` tokens joined by single spaces) and ``splits`` (file indices, in path order).
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import platform
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run from a checkout without installing

from benchmarks.data.long_range.build_retrieval_data import (
    TOKEN,
    run_builder,
    split_documents,
    tokenize,
)

GROUPS: dict[str, tuple[str, ...]] = {
    "concurrency": (
        "asyncio/*", "concurrent/*", "multiprocessing/*", "threading.py", "_threading_local.py", "queue.py",
        "selectors.py", "sched.py", "asyncore.py", "asynchat.py", "subprocess.py", "signal.py", "test/test_asyncio/*",
        "test/test_concurrent_futures*", "test/_test_multiprocessing.py", "test/test_multiprocessing*",
        "test/test_thread*", "test/test_queue.py", "test/test_selectors.py", "test/test_asyncore.py",
        "test/test_asynchat.py", "test/test_subprocess.py", "test/test_signal.py", "test/lock_tests.py",
        "test/test_sched.py", "test/test_contextlib_async.py"),
    "email": (
        "email/*", "mailbox.py", "smtplib.py", "smtpd.py", "imaplib.py", "poplib.py", "mailcap.py", "mimetypes.py",
        "quopri.py", "test/test_email/*", "test/test_mailbox.py", "test/test_smtp*.py", "test/test_imaplib.py",
        "test/test_poplib.py", "test/test_mailcap.py", "test/test_mimetypes.py", "test/test_quopri.py"),
    "network": (
        "http/*", "urllib/*", "xmlrpc/*", "wsgiref/*", "socket.py", "socketserver.py", "ssl.py", "ftplib.py",
        "nntplib.py", "telnetlib.py", "webbrowser.py", "ipaddress.py", "cgi.py", "cgitb.py", "test/test_http*",
        "test/test_urllib*", "test/test_urlparse.py", "test/test_xmlrpc*.py", "test/test_docxmlrpc.py",
        "test/test_wsgiref.py", "test/test_socket*.py", "test/test_ssl.py", "test/ssl_servers.py",
        "test/test_ftplib.py", "test/test_nntplib.py", "test/test_telnetlib.py", "test/test_webbrowser.py",
        "test/test_ipaddress.py", "test/test_robotparser.py", "test/test_cgi*.py", "test/test_timeout.py"),
    "gui": (
        "tkinter/*", "idlelib/*", "turtle.py", "turtledemo/*", "test/test_tkinter/*", "test/test_ttk/*",
        "test/test_idle.py", "test/test_turtle.py", "test/test_tcl.py", "test/test_ttk_*.py"),
    "code": (
        "lib2to3/*", "ast.py", "dis.py", "tokenize.py", "token.py", "inspect.py", "symtable.py", "pyclbr.py",
        "compileall.py", "py_compile.py", "tabnanny.py", "opcode.py", "codeop.py", "code.py", "test/test_ast.py",
        "test/test_dis.py", "test/test_tokenize.py", "test/test_grammar.py", "test/test_compile*.py",
        "test/test_syntax.py", "test/test_peg_generator/*", "test/test_lib2to3/*", "test/test_inspect*",
        "test/test_symtable.py", "test/test_pyclbr.py", "test/test_unparse.py", "test/test_tabnanny.py",
        "test/test_clinic.py", "test/test_fstring.py", "test/test_patma.py", "test/test_peepholer.py",
        "test/test_code_module.py", "test/test_codeop.py"),
    "packaging": (
        "distutils/*", "importlib/*", "ensurepip/*", "venv/*", "pkgutil.py", "zipimport.py", "site.py", "sysconfig.py",
        "modulefinder.py", "runpy.py", "test/test_importlib/*", "test/test_distutils.py", "test/test_venv.py",
        "test/test_pkgutil.py", "test/test_zipimport*.py", "test/test_site.py", "test/test_sysconfig.py",
        "test/test_modulefinder.py", "test/test_runpy.py", "test/test_import/*", "test/test_ensurepip.py"),
    "formats": (
        "json/*", "xml/*", "html/*", "csv.py", "pickle.py", "pickletools.py", "_compat_pickle.py", "plistlib.py",
        "tomllib/*", "configparser.py", "zipfile.py", "tarfile.py", "gzip.py", "bz2.py", "lzma.py", "shelve.py",
        "dbm/*", "sqlite3/*", "base64.py", "uu.py", "test/test_json/*", "test/test_xml_*.py", "test/test_minidom.py",
        "test/test_sax.py", "test/test_pulldom.py", "test/test_pyexpat.py", "test/test_html*.py", "test/test_csv.py",
        "test/test_pickle*.py", "test/pickletester.py", "test/test_plistlib.py", "test/test_tomllib/*",
        "test/test_configparser.py", "test/test_zipfile*", "test/test_tarfile.py", "test/test_gzip.py",
        "test/test_bz2.py", "test/test_lzma.py", "test/test_zlib.py", "test/test_shelve.py", "test/test_dbm*.py",
        "test/test_sqlite3/*", "test/test_base64.py"),
    "numbers": (
        "decimal.py", "_pydecimal.py", "fractions.py", "statistics.py", "random.py", "numbers.py", "datetime.py",
        "_strptime.py", "calendar.py", "zoneinfo/*", "test/test_math.py", "test/test_cmath.py", "test/test_decimal.py",
        "test/test_fractions.py", "test/test_statistics.py", "test/test_random.py", "test/test_float.py",
        "test/test_long.py", "test/test_complex.py", "test/test_int.py", "test/test_numeric_tower.py",
        "test/datetimetester.py", "test/test_calendar.py", "test/test_zoneinfo/*", "test/test_strptime.py",
        "test/test_time.py", "test/test_math_property.py"),
    "files": (
        "os.py", "pathlib.py", "shutil.py", "tempfile.py", "glob.py", "fnmatch.py", "ntpath.py", "posixpath.py",
        "genericpath.py", "stat.py", "filecmp.py", "fileinput.py", "io.py", "_pyio.py", "test/test_os.py",
        "test/test_pathlib.py", "test/test_shutil.py", "test/test_tempfile.py", "test/test_ntpath.py",
        "test/test_posixpath.py", "test/test_genericpath.py", "test/test_io.py", "test/test_glob.py",
        "test/test_fnmatch.py", "test/test_fileio.py", "test/test_filecmp.py", "test/test_fileinput.py",
        "test/test_stat.py", "test/test_file.py", "test/test_largefile.py", "test/test_univnewlines.py",
        "test/test_memoryio.py", "test/test_posix.py"),
}
"""Topic groups of standard-library files: their names (the labels, in this order) and path patterns."""
MIN_BODY_TOKENS = 1023
"""The shortest body kept: a window at T = 1024 is [CLS] + 1023 body tokens."""
LONG_BODY_TOKENS = 4095
"""A long body holds T = 4096's window; the splits take their share of each group's long bodies apart."""
BODY_TOKENS = 8192
"""Body tokens kept per file: twice the longest window (T = 4096), so windows start at many offsets."""
HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "topic.json.gz"


def group_of(path: str) -> str | None:
    """The group of a file by its path relative to the standard library (``GROUPS``), or None."""
    return next((group for group, patterns in GROUPS.items()
                 if any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)), None)


def is_header(statement: ast.stmt) -> bool:
    """Whether a top-level statement belongs to a module's header: a string expression (the docstring), an
    import, or an assignment to dunder names only (``__all__``, ``__version__``, ...)."""
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str)
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return True
    targets = (statement.targets if isinstance(statement, ast.Assign)
               else [statement.target] if isinstance(statement, ast.AnnAssign) else [])
    return bool(targets) and all(isinstance(target, ast.Name) and target.id.startswith("__")
                                 and target.id.endswith("__") for target in targets)


def body_start(module: ast.Module) -> int | None:
    """The first line (1-based) of the body: of the first statement after the leading header statements (or of
    its first decorator); None when the module is all header."""
    for statement in module.body:
        if not is_header(statement):
            decorators = getattr(statement, "decorator_list", [])
            return min([statement.lineno] + [decorator.lineno for decorator in decorators])
    return None


def read_files(stdlib: Path) -> list[dict[str, object]]:
    """The kept files, in path order: ``path``, ``group``, ``tokens`` (the body's count) and ``body``."""
    files, seen = [], set()
    for path in sorted(stdlib.rglob("*.py")):
        relative = path.relative_to(stdlib).as_posix()
        group = group_of(relative)
        if group is None:
            continue
        try:
            text = path.read_text(encoding="utf-8")
            start = body_start(ast.parse(text))
        except (UnicodeDecodeError, OSError, SyntaxError, ValueError):
            continue
        digest = hashlib.sha256(text.encode()).digest()
        body = [] if start is None else tokenize("\n".join(text.split("\n")[start - 1:]))
        if digest in seen or len(body) < MIN_BODY_TOKENS:
            continue
        seen.add(digest)
        files.append({"path": relative, "group": group, "tokens": len(body), "body": " ".join(body[:BODY_TOKENS])})
    return files


def split_files(files: list[dict[str, object]], rng: random.Random) -> dict[str, list[int]]:
    """File indices per split, disjoint, in index order: each stratum (a group's files with long bodies, and its
    others) split alike by ``split_documents``."""
    splits: dict[str, list[int]] = {"train": [], "validation": [], "test": []}
    for group in GROUPS:
        for long in (True, False):
            members = [index for index, file in enumerate(files)
                       if file["group"] == group and (file["tokens"] >= LONG_BODY_TOKENS) == long]
            for name, positions in split_documents(len(members), rng).items():
                splits[name] += [members[position] for position in positions]
    return {name: sorted(indices) for name, indices in splits.items()}


def build(stdlib: Path, seed: int) -> dict[str, object]:
    """The whole data set: the groups, the files and the splits."""
    files = read_files(stdlib)
    return {
        "source": f"Python {platform.python_version()} standard library sources",
        "seed": seed, "body_tokens": BODY_TOKENS, "min_body_tokens": MIN_BODY_TOKENS, "token_pattern": TOKEN.pattern,
        "groups": list(GROUPS), "patterns": GROUPS, "files": files,
        "splits": split_files(files, random.Random(seed)),
    }


def main(argv: list[str] | None = None) -> int:
    return run_builder(argv, __doc__.split("\n\n")[0], OUTPUT, build, lambda data: (
        f"{len(data['files'])} files in {len(GROUPS)} groups, "
        f"per split {({name: len(indices) for name, indices in data['splits'].items()})}"))


if __name__ == "__main__":
    raise SystemExit(main())
