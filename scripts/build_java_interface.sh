#!/bin/sh
# Rebuild inferpool/runtimes/java_interface/inferpool-model.jar from its source
# (io/inferpool/Model.java, the interface a model of the `java` runtime implements, and
# Rows.java, the server's helper), for
# Java 11 and newer. The jar is committed: the runtime needs only a JRE, no compiler.
# tests/java/test_jvm_runtimes.py checks that the jar matches the source.
set -eu
here=$(cd "$(dirname "$0")/../inferpool/runtimes/java_interface" && pwd)
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
javac --release 11 -d "$classes" "$here"/io/inferpool/*.java
# --date: the same bytes from the same source (reproducible entries' timestamps)
jar --create --date=2026-01-01T00:00:00Z --file "$here/inferpool-model.jar" -C "$classes" io
