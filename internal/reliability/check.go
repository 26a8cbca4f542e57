package reliability

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// OutEnv names the environment variable with the folder where porcupine's HTML
// visualisations are written; by default they go to ./out beside the test
// output (the package folder, go test's working directory).
const OutEnv = "RELIABILITY_OUT"

// checkTimeout bounds one porcupine check; a history that cannot be decided
// in time counts as a failure to check, never as a pass.
const checkTimeout = 60 * time.Second

// Check runs porcupine on ops with model. When the result is not want (""
// accepts any), or
// when RELIABILITY_OUT is set, it writes the visualisation to
// <out>/<test>-<label>.html and logs the path. It returns the result.
func Check(tb testing.TB, label string, model porcupine.NondeterministicModel, ops []porcupine.Operation, want porcupine.CheckResult) porcupine.CheckResult {
	tb.Helper()
	m := model.ToModel()
	res, info := porcupine.CheckOperationsVerbose(m, ops, checkTimeout)
	out := os.Getenv(OutEnv)
	if (res == want || want == "") && out == "" {
		return res
	}
	if out == "" {
		out = "out"
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		tb.Logf("cannot write visualisation: %v", err)
		return res
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name()) + "-" + label + ".html"
	path := filepath.Join(out, name)
	if err := porcupine.VisualizePath(m, info, path); err != nil {
		tb.Logf("cannot write visualisation: %v", err)
		return res
	}
	abs, _ := filepath.Abs(path)
	tb.Logf("%s: porcupine says %s over %d operations; visualisation: %s", label, res, len(ops), abs)
	return res
}
