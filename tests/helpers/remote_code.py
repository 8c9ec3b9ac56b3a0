"""The files ``save_pretrained`` exports as remote code, derived from the package's own imports."""

import ast
from pathlib import Path

import hf_mdm

PACKAGE_DIR = Path(hf_mdm.__file__).parent
EXPORT_ALLOWED_IMPORTS = {"torch", "transformers", "__future__"}


def exported_files(*roots: str) -> dict[str, set[str]]:
    """The modules the remote-code export needs, found by following single-dot imports from ``roots``, with the
    top-level packages each of them imports."""
    found: dict[str, set[str]] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        tree = ast.parse((PACKAGE_DIR / name).read_text())
        found[name] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module and "." not in node.module, (name, node.module)
                todo.append(f"{node.module}.py")
            elif isinstance(node, ast.ImportFrom):
                found[name].add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                found[name].update(alias.name.split(".")[0] for alias in node.names)
    return found
