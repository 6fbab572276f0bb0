"""The suggestion search of the static resolver: which modules of a package define a name at top
level (where a missing name moved to). Stdlib only.
"""

import bisect

from ..resolve.modules import ModInfo


class Suggestions:
    """Mixed into ``StaticResolver``: uses ``_package_files`` and ``load`` (``ModuleIndex``)."""

    def find_definitions(self, package, name, limit=400):
        """Modules of ``package`` (files on the search path) that define top-level ``name``.

        The package's files are read once per resolver (every missing name of a check searches
        the same bytes); only files holding ``def name``/``class name``/``name =``/``name:`` are
        parsed, to confirm a top-level binding.
        """
        hits, count = [], 0
        needle = name.encode()
        pats = (b"def " + needle, b"class " + needle, needle + b" =", needle + b":")
        blob, starts, names = self._package_files(package)
        candidates, pos = [], blob.find(needle)
        while pos >= 0:
            i = bisect.bisect_right(starts, pos) - 1
            candidates.append(i)
            pos = blob.find(needle, starts[i + 1] if i + 1 < len(starts) else len(blob))
        for i in candidates:
            data = blob[starts[i]:starts[i + 1] if i + 1 < len(starts) else len(blob)]
            modname = names[i]
            if not any(p in data for p in pats):
                continue
            m = self.load(modname)
            if isinstance(m, ModInfo):
                b = m.names.get(name)
                if b is not None and b[0] in ("def", "value"):
                    hits.append(modname)
            count += 1
            if count > limit:
                break
        return hits
