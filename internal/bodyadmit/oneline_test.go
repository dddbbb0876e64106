package bodyadmit_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stepcollect/stepcollect/internal/bodyadmit"
)

func TestOneLineMaxKeepsOneLineAndWholeCharacters(t *testing.T) {
	if got := bodyadmit.OneLineMax("a\nb\tc", 100); got != "a b c" {
		t.Errorf("control characters: %q", got)
	}
	// "é" is two bytes: a cut at an odd byte would split one
	s := strings.Repeat("é", 10)
	for max := 1; max < len(s); max++ {
		got := bodyadmit.OneLineMax(s, max)
		if !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || len(got)-len("…") > max {
			t.Errorf("max %d: %q", max, got)
		}
	}
	if got := bodyadmit.OneLineMax(s, len(s)); got != s {
		t.Errorf("at the bound: %q, want it whole", got)
	}
}
