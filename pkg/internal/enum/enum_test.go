package enum

import "testing"

type color string

var colors = Set[color]{"red", "green", "blue"}

func TestChoices(t *testing.T) {
	if got, want := colors.Choices(), "red, green or blue"; got != want {
		t.Errorf("Choices() = %q, want %q", got, want)
	}
	if got, want := (Set[color]{"red", "green"}).Choices(), "red or green"; got != want {
		t.Errorf("Choices() = %q, want %q", got, want)
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]color{"red": "red", " Green ": "green", "BLUE": "blue"} {
		if got, err := colors.Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := colors.Parse("pink")
	if err == nil || err.Error() != `"pink": use red, green or blue` {
		t.Errorf(`Parse("pink") error = %v, want "pink": use red, green or blue`, err)
	}
}
