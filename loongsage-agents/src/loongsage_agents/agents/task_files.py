"""The task-file convention shared by the agents that repair code in a repository copy.

A coding task's prompt carries its repository as ``metadata["files"]`` (relative path ->
text), which an agent puts in its sandbox or work dir; after the run the agent reads back
the file named by its ``submit_file`` param and hands it to the reward as
``submission(content)``: the file as one ```` ```python ```` block, which the ``code_exec``
reward's ``extract_code`` reads back exactly, as long as the file holds no three backticks
in a row (they would end the block early).
"""

from __future__ import annotations

from typing import Any


def task_files(prompt: Any) -> dict[str, str]:
    """The prompt's repository files, ``metadata["files"]``, checked: relative path -> text."""
    where = f"prompt {prompt.source}#{prompt.index}: metadata['files']"
    files = prompt.metadata.get("files")
    if not isinstance(files, dict) or not files:
        raise ValueError(f"{where} must be a non-empty mapping of relative path to file text, "
                         f"got {type(files).__name__}")
    for path, text in files.items():
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            raise ValueError(f"{where}: {path!r} is not a relative path inside the work dir")
        if not isinstance(text, str):
            raise ValueError(f"{where}[{path!r}] must be the file's text (str), got {type(text).__name__}")
    return dict(files)


def submission(code: str) -> str:
    """``code`` as the fenced block the ``code_exec`` reward extracts, byte for byte."""
    return f"```python\n{code}```"
