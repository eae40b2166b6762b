// Package swapflags is what the two swap commands, `inplacectl swap` and
// `kubectl inplace swap`, say alike about a swap's change to a container:
// the flags --image, --env, --unset-env and --command, and how --env is
// read. A leaf (pflag and the standard library), so that the plugin links
// it without the daemon.
package swapflags

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// AddChange registers --image, --env, --unset-env and --command on f,
// bound to image, env (K=V, read by ParseEnv), unsetEnv and command.
func AddChange(f *pflag.FlagSet, image *string, env, unsetEnv, command *[]string) {
	f.StringVar(image, "image", "", "new image reference (pulled before anything is stopped)")
	f.StringArrayVar(env, "env", nil, "set an environment variable K=V (repeatable)")
	f.StringArrayVar(unsetEnv, "unset-env", nil, "remove an environment variable (repeatable)")
	f.StringArrayVar(command, "command", nil, "new command, one element per flag (repeatable)")
}

// ParseEnv reads the values of --env, each KEY=VALUE (the value may hold
// '=' and be empty); nil for none.
func ParseEnv(kvs []string) (map[string]string, error) {
	var env map[string]string
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		if env == nil {
			env = map[string]string{}
		}
		env[k] = v
	}
	return env, nil
}
