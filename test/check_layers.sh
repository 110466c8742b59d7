#!/usr/bin/env bash
# The architecture, checked: src/core includes no PostgreSQL glue, and each folder of
# src/pg includes only itself and the folders before it in LAYERS (src/pg/README.md),
# so no arrow runs back up and no circle forms. Prints each violation; exit 1 if any.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS=(common citus keys messaging worker module)
bad=0
while IFS=: read -r file _ include; do
  echo "src/core may not include the PostgreSQL glue: $file: $include"
  bad=1
done < <(grep -rn '#include "pg/' src/core || true)
for ((i = 0; i < ${#LAYERS[@]}; i++)); do
  for file in src/pg/"${LAYERS[i]}"/*; do
    while read -r folder; do
      allowed=no
      for ((j = 0; j <= i; j++)); do [ "$folder" = "${LAYERS[j]}" ] && allowed=yes; done
      if [ "$allowed" = no ]; then
        echo "$file (${LAYERS[i]}) includes pg/$folder/: only ${LAYERS[*]:0:i+1} may be"
        bad=1
      fi
    done < <(sed -n 's|^#include "pg/\([a-z_]*\)/.*|\1|p' "$file")
  done
done
stray=$(find src/pg -maxdepth 1 -type f \( -name '*.cpp' -o -name '*.hpp' \))
if [ -n "$stray" ]; then
  echo "a source file outside the folders of src/pg: $stray"
  bad=1
fi
[ "$bad" = 0 ] && echo "src/pg layers: ${LAYERS[*]}, no include runs back up"
exit "$bad"
