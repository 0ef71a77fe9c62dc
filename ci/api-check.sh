#!/usr/bin/env bash
# The public API check: cargo-semver-checks compares the published crates' public API with the
# last release, the commit named in ci/api-baseline. A change that needs a bigger version bump
# than Cargo.toml has (0.x: a breaking change needs the minor version bumped) fails, and a
# version that differs from the baseline's needs a CHANGELOG.md heading of its own.
#   bash ci/api-check.sh            # what .ci/run does
#   BASELINE=<rev> bash ci/api-check.sh   # against another commit (e.g. to try a break)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.51.0   # cargo-semver-checks, pinned (it must read the rustdoc JSON of this toolchain)
if ! cargo semver-checks --version 2>/dev/null | grep -q " $VERSION\$"; then
  cargo install cargo-semver-checks --version "$VERSION" --locked
fi
baseline=${BASELINE:-$(grep -v '^#' ci/api-baseline | head -n1 | tr -d '[:space:]')}
git rev-parse --verify -q "$baseline^{commit}" >/dev/null \
  || { echo "api-check: the baseline commit $baseline is not in this clone (ci/api-baseline; fetch full history)"; exit 1; }

current=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
released=$(git show "$baseline:Cargo.toml" | sed -n 's/^version = "\(.*\)"$/\1/p' | head -n1)
echo "api-check: workspace version $current, baseline $released at $(git rev-parse --short "$baseline")"
if [ "$current" != "$released" ]; then
  grep -q "^## \[$current\]" CHANGELOG.md \
    || { echo "api-check: version $current differs from the release $released, but CHANGELOG.md has no '## [$current]' heading"; exit 1; }
fi

# The crates users name in their code, each with the features that add public API (SQLite,
# the broker sinks). Both sides build in one target dir, so the baseline reuses the current
# side's dependencies.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/semver-checks"
check() { cargo semver-checks check-release --baseline-rev "$baseline" --only-explicit-features "$@"; }
check -p taskq-driver
check -p taskq-outbox --features nats,rabbitmq,redis
check -p taskq --features sqlite,nats,rabbitmq,redis
check -p taskq-web
