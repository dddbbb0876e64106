package examples_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// source returns the text of file from the start of the declaration named
// first to the end of the one named last (doc comments left out).
func source(t *testing.T, file, first, last string) string {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var from, to token.Pos
	for _, d := range f.Decls {
		name := ""
		switch d := d.(type) {
		case *ast.FuncDecl:
			name = d.Name.Name
		case *ast.GenDecl:
			if ts, ok := d.Specs[0].(*ast.TypeSpec); ok && d.Tok == token.TYPE {
				name = ts.Name.Name
			}
		}
		if name == first {
			from = d.Pos()
		}
		if name == last {
			to = d.End()
		}
	}
	if !from.IsValid() || !to.IsValid() {
		t.Fatalf("%s: no %s or %s", file, first, last)
	}
	return string(src[fset.Position(from).Offset:fset.Position(to).Offset])
}

// fenceAfter returns the first ```go block of the document after marker.
func fenceAfter(t *testing.T, readme, marker string) string {
	t.Helper()
	i := strings.Index(readme, marker)
	if i < 0 {
		t.Fatalf("docs/engines.md has no %q", marker)
	}
	rest := readme[i:]
	start := strings.Index(rest, "```go\n")
	if start < 0 {
		t.Fatalf("no ```go block after %q", marker)
	}
	rest = rest[start+len("```go\n"):]
	return strings.TrimSuffix(rest[:strings.Index(rest, "```\n")], "\n")
}

// docs/engines.md's code is the code go test compiles and runs: the NanoCMD
// example and the callback receiver, character for character.
func TestTheREADMEShowsTheCompiledExamples(t *testing.T) {
	b, err := os.ReadFile("../docs/engines.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, c := range []struct{ marker, file, first, last string }{
		{"This is `examples/nanocmd_example_test.go`", "nanocmd_example_test.go", "Example_nanocmd", "Example_nanocmd"},
		{"## Receiving events", "../delivery/example_test.go", "Receiver", "ServeHTTP"},
	} {
		want := source(t, c.file, c.first, c.last)
		if got := fenceAfter(t, readme, c.marker); got != want {
			t.Errorf("docs/engines.md's code after %q is not %s's %s…%s as it is:\n--- docs/engines.md\n%s\n--- %s\n%s", c.marker, c.file, c.first, c.last, got, c.file, want)
		}
	}
}
