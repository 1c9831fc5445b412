"""The native runtime (C ABI shared libraries, tl2cgen's compiled trees): tox -e languages."""
