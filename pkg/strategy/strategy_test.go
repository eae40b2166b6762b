package strategy

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Strategy
		err  string
	}{
		{"stop-first", StopFirst, ""},
		{"overlap", Overlap, ""},
		{" Overlap\n", Overlap, ""}, // as an annotation or a YAML value may spell it
		{"STOP-FIRST", StopFirst, ""},
		{"blue-green", "", `"blue-green": use stop-first or overlap`},
		{"", "", `"": use stop-first or overlap`},
		{"overlap,stop-first", "", `"overlap,stop-first": use stop-first or overlap`},
	} {
		got, err := Parse(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("Parse(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
	if Default != StopFirst {
		t.Errorf("Default = %q: the documented default is stop-first", Default)
	}
	if Annotation != "inplaced.io/swap-strategy" {
		t.Errorf("Annotation = %q: the name is a contract", Annotation)
	}
}
