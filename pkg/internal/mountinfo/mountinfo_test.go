package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/mnt/plain`:      "/mnt/plain",
		`/mnt/a\040b`:     "/mnt/a b",
		`/mnt/tab\011end`: "/mnt/tab\tend",
		`/mnt/back\134`:   `/mnt/back\`,
		`/mnt/short\04`:   `/mnt/short\04`, // too short to be an escape
		`/mnt/not\999`:    `/mnt/not\999`,  // not octal
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
