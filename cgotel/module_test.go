package cgotel_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// TestFetchableWithoutReplace does what a user of cgotel does in a module of
// their own: go get the cgotel of this checkout's HEAD commit and build a
// program that uses it. Both modules are fetched with git from this checkout
// (GOPROXY is bypassed for github.com/cacheguard/* and github.com's address is
// rewritten to the local repository), so the test proves that cgotel's go.mod
// requires a version of cacheguard that exists and that cgotel builds against
// it, with no replace directive and no go.work. It checks the committed HEAD,
// not the working tree.
func TestFetchableWithoutReplace(t *testing.T) {
	if testing.Short() {
		t.Skip("fetches modules with git")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	top := strings.TrimSpace(run(t, "", nil, "git", "rev-parse", "--show-toplevel"))
	head := strings.TrimSpace(run(t, "", nil, "git", "-C", top, "rev-parse", "HEAD"))

	data, err := os.ReadFile(filepath.Join(top, "cgotel", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mf, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(mf.Replace) > 0 {
		t.Fatalf("cgotel/go.mod has a replace directive (%v): users' builds ignore it; develop with go.work", mf.Replace[0].Old)
	}
	var want string
	for _, r := range mf.Require {
		if r.Mod.Path == "github.com/cacheguard/cacheguard" {
			want = r.Mod.Version
		}
	}
	if want == "" {
		t.Fatal("cgotel/go.mod does not require github.com/cacheguard/cacheguard")
	}
	if rev := revisionOf(want); rev != "" {
		if exec.Command("git", "-C", top, "cat-file", "-e", rev+"^{commit}").Run() != nil {
			t.Skipf("cgotel requires cacheguard %s, whose commit this (shallow?) clone lacks", want)
		}
	}

	dir := t.TempDir()
	gitcfg := filepath.Join(dir, "gitconfig")
	rewrite := "[url \"file://" + top + "\"]\n\tinsteadOf = https://github.com/cacheguard/cacheguard\n"
	if err := os.WriteFile(gitcfg, []byte(rewrite), 0o600); err != nil {
		t.Fatal(err)
	}
	// The machine's module cache is shared (its other modules and their
	// compiled packages are reused); cacheguard's versions are added to it,
	// fetched from this checkout, which holds the same commits as github.com.
	env := []string{
		"GIT_CONFIG_GLOBAL=" + gitcfg,
		"GIT_CONFIG_NOSYSTEM=1",
		"GOPRIVATE=github.com/cacheguard",
		"GOFLAGS=-mod=mod",
		"GOWORK=off",
	}

	consumer := filepath.Join(dir, "consumer")
	if err := os.Mkdir(consumer, 0o755); err != nil {
		t.Fatal(err)
	}
	main := "package main\n\nimport \"github.com/cacheguard/cacheguard/cgotel\"\n\nfunc main() { _ = cgotel.New() }\n"
	if err := os.WriteFile(filepath.Join(consumer, "main.go"), []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, consumer, env, "go", "mod", "init", "example.com/consumer")
	run(t, consumer, env, "go", "get", "github.com/cacheguard/cacheguard/cgotel@"+head)
	run(t, consumer, env, "go", "build", "-o", os.DevNull, ".")
	got := run(t, consumer, env, "go", "list", "-m", "github.com/cacheguard/cacheguard")
	if !strings.Contains(got, want) {
		t.Errorf("the consumer builds with cacheguard %q, want cgotel's requirement %s", strings.TrimSpace(got), want)
	}
}

// revisionOf returns the commit prefix of a pseudo-version, or "" for a tag.
func revisionOf(version string) string {
	i := strings.LastIndexByte(version, '-')
	if i < 0 || strings.Count(version, "-") < 2 {
		return ""
	}
	return version[i+1:]
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}
