#!/usr/bin/env bash
# Lint: staticcheck on every package of the library's module (tests included) and
# errcheck on the library's code (not tests), the linters golangci-lint runs by
# default besides go vet. Both come through the Go module proxy at pinned versions.
set -euo pipefail
cd "$(dirname "$0")/../.."
staticcheck=honnef.co/go/tools/cmd/staticcheck@v0.8.2
errcheck=github.com/kisielk/errcheck@v1.9.0
library=(./locks/... ./cacheguard/... ./ginmw/... ./gormplugin/... ./internal/wake/... ./internal/rcmd/... ./internal/ratelog/... ./internal/slot/... ./internal/counter/...)
status=0
go run "$staticcheck" ./... || status=1
(cd cgotel && go run "$staticcheck" ./...) || status=1
go run "$errcheck" -ignoretests -exclude internal/tools/errcheck-exclude.txt "${library[@]}" || status=1
if [ $status -ne 0 ]; then echo "lint: findings above (library code must be clean)" >&2; fi
exit $status
