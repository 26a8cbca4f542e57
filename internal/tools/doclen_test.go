// Package tools holds the repository's maintenance scripts and the checks
// that keep its conventions true (CONTRIBUTING.md).
package tools

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxDocLines is the most lines a package doc may take: usage, guarantees and
// limits; design material goes to the package's DESIGN.md (CONTRIBUTING.md,
// "Names").
const maxDocLines = 150

// TestPackageDocsAreShort fails when the package doc of any package in the
// repository (every module: the library, cgotel, benchmarks) runs longer than
// maxDocLines, counted as the lines of its file up to the package clause.
func TestPackageDocsAreShort(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		if f.Doc == nil {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		checked[filepath.Dir(rel)] = true
		if n := fset.Position(f.Package).Line; n > maxDocLines {
			t.Errorf("%s: the package doc runs %d lines, more than %d: keep it to usage, guarantees and limits, and move design material to %s",
				rel, n, maxDocLines, filepath.Join(filepath.Dir(rel), "DESIGN.md"))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The library's packages must have been seen (cgotel and benchmarks are
	// checked when present: they are modules of their own, absent from this
	// module's zip).
	for _, pkg := range []string{"cacheguard", "locks", "ginmw", "gormplugin"} {
		if !checked[pkg] {
			t.Errorf("no package doc found for %s under %s", pkg, root)
		}
	}
}
