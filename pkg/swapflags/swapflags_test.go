package swapflags

import (
	"maps"
	"testing"

	"github.com/spf13/pflag"
)

func TestAddChange(t *testing.T) {
	var image string
	var env, unset, command []string
	f := pflag.NewFlagSet("swap", pflag.ContinueOnError)
	AddChange(f, &image, &env, &unset, &command)
	if err := f.Parse([]string{"--image", "web:v2", "--env", "A=1", "--env", "B=x=y", "--unset-env", "C", "--command", "sh", "--command", "-c"}); err != nil {
		t.Fatal(err)
	}
	if image != "web:v2" || len(env) != 2 || len(unset) != 1 || len(command) != 2 || command[1] != "-c" {
		t.Errorf("got image %q env %q unset-env %q command %q", image, env, unset, command)
	}
}

func TestParseEnv(t *testing.T) {
	got, err := ParseEnv([]string{"A=1", "B=x=y", "C="})
	if want := map[string]string{"A": "1", "B": "x=y", "C": ""}; err != nil || !maps.Equal(got, want) {
		t.Errorf("ParseEnv = %v, %v; want %v", got, err, want)
	}
	if got, err := ParseEnv(nil); err != nil || got != nil {
		t.Errorf("ParseEnv(nil) = %v, %v; want nil, nil", got, err)
	}
	for _, bad := range []string{"A", "=1"} {
		if _, err := ParseEnv([]string{bad}); err == nil || err.Error() != `--env "`+bad+`": want KEY=VALUE` {
			t.Errorf("ParseEnv(%q) error = %v", bad, err)
		}
	}
}
