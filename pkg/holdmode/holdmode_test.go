package holdmode

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mode
		err  string
	}{
		{"queue", Queue, ""},
		{"drop", Drop, ""},
		{"off", Off, ""},
		{" Queue\n", Queue, ""}, // as an annotation or a YAML value may spell it
		{"OFF", Off, ""},
		{"park", "", `"park": use queue, drop or off`},
		{"", "", `"": use queue, drop or off`},
		{"queue,drop", "", `"queue,drop": use queue, drop or off`},
	} {
		got, err := Parse(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("Parse(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
	if Default != Queue {
		t.Errorf("Default = %q: --connection-hold's documented default is queue", Default)
	}
}
