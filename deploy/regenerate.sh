#!/usr/bin/env bash
# Rewrites deploy/k8s/base/moongate.toml and deploy/master.toml from the binary: a comment header, then
# exactly what `moongate serve --print-config` and `moongate master --print-config` print with
# no --config file, no MOONGATE_* variable and no flag. gateway/moongate/tests/deploy.rs fails while
# either file differs from that output.
set -euo pipefail
cd "$(dirname "$0")/.."

# The files hold the defaults: nothing from this shell may leak into them.
while IFS='=' read -r name _; do
  if [[ $name == MOONGATE_* ]]; then unset "$name"; fi
done < <(env)

# MOONGATE_FEATURES: build with the features .ci/run tests with (reuses its build).
cargo build -q -p moongate ${MOONGATE_FEATURES:+--features "$MOONGATE_FEATURES"}

# write SUBCOMMAND FILE WHERE: the header, then the subcommand's --print-config output.
write() {
  local cmd=$1 file=$2 where=$3
  {
    printf '%s\n' \
      "# Every \`moongate $cmd\` setting at its default: exactly what \`moongate $cmd --print-config\`" \
      "# prints with no --config, no MOONGATE_* variable and no flag. The defaults live in the" \
      "# config structs ($where), not here." \
      "# After changing one, run deploy/regenerate.sh (gateway/moongate/tests/deploy.rs fails while this" \
      "# file differs from the binary's defaults)." \
      "# Use: \`moongate $cmd --config $(basename "$file")\`; MOONGATE_* variables and flags win over" \
      "# its keys. Settings that are off unless given (keys, optional ports and limits) do not" \
      "# appear; \`moongate $cmd --help\` lists every setting with its meaning." \
      ""
    cargo run -q -p moongate -- "$cmd" --print-config
  } > "$file.tmp"
  mv "$file.tmp" "$file"
  echo "wrote $file"
}

write serve deploy/k8s/base/moongate.toml "gateway/config/src/lib.rs; [master]: kvmaster::MasterConfig"
write master deploy/master.toml "gateway/config/src/master.rs; [master]: kvmaster::MasterConfig"
