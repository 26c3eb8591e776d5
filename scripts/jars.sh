#!/usr/bin/env bash
# Usage: jars.sh DEST [DIR...]
# Resolves the JVM artifacts the project runs with from Maven Central, by the coordinates
# declared in jvm/<set>/pom.xml (versions pinned there), into DEST/<set>/ — the Python
# environment's share/spanner-cdc/jars, where spanner_cdc.common.jars finds them (every
# jvm/<set> unless DIRs holding a pom.xml are named; a set is named after its DIR):
#   kafka  the embedded Apache Kafka broker (spanner-cdc stack up)
#   spark  Spark's own connectors for PySpark's Spark version (spanner-cdc consume)
# Maven keeps what it downloaded in ~/.m2, so a second clone fetches nothing; Maven itself comes
# from scripts/system-deps.sh. Nothing is fetched at run time.
set -euo pipefail
dest=$(mkdir -p "${1:?usage: jars.sh DEST [DIR...]}" && cd "$1" && pwd)
shift
here=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -gt 0 ]; then
  poms=()
  for dir in "$@"; do poms+=("$(cd "$dir" && pwd)/pom.xml"); done
else
  poms=("$here"/jvm/*/pom.xml)
fi

if ! command -v mvn >/dev/null 2>&1; then
  echo "jars: Maven is missing; scripts/system-deps.sh installs it (apt-get install -y maven)" >&2
  exit 1
fi

for pom in "${poms[@]}"; do
  set_name=$(basename "$(dirname "$pom")")
  out="$dest/$set_name"
  rm -rf "$out.new"
  if ! mvn -B -q -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$out.new" >"$dest/$set_name.mvn.log" 2>&1; then
    echo "jars: resolving $pom failed; the end of $dest/$set_name.mvn.log:" >&2
    tail -n 20 "$dest/$set_name.mvn.log" >&2
    exit 1
  fi
  cp "$pom" "$out.new/pom.xml"
  rm -rf "$out"
  mv "$out.new" "$out"
  echo "jars: $set_name: $(find "$out" -name '*.jar' | wc -l) jars in $out" >&2
done
