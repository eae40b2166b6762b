package install

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// The configuration files here (kubelet's, k3s's, inplaced's) are changed
// one top-level line at a time, never parsed and written back whole: the
// rest of the file, comments and order included, stays byte for byte, and
// an uninstall puts a changed line back as it was.

// keyLine matches the top-level line of key.
func keyLine(key string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `:.*$`)
}

// lineOf returns the top-level line of key in data, "" when there is none.
func lineOf(data []byte, key string) string {
	return string(keyLine(key).Find(data))
}

// setLine puts line in place of key's top-level line, or after the last
// line when there is none; an empty line removes key's line.
func setLine(data []byte, key, line string) []byte {
	re := keyLine(key)
	if loc := re.FindIndex(data); loc != nil {
		if line != "" {
			return concat(data[:loc[0]], []byte(line), data[loc[1]:])
		}
		end := loc[1]
		if end < len(data) && data[end] == '\n' {
			end++
		}
		return concat(data[:loc[0]], data[end:])
	}
	if line == "" {
		return data
	}
	out := append([]byte(nil), data...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, line+"\n"...)
}

// setTemplateKey sets key in a template whose keys may be commented out
// ("# key: example"): the first such line, commented or not, becomes
// "key: value"; a key the template lacks is added at the end.
func setTemplateKey(data []byte, key, value string) []byte {
	re := regexp.MustCompile(`(?m)^(# ?)?` + regexp.QuoteMeta(key) + `:.*$`)
	line := key + ": " + strconv.Quote(value)
	if loc := re.FindIndex(data); loc != nil {
		return concat(data[:loc[0]], []byte(line), data[loc[1]:])
	}
	return setLine(data, key, line)
}

func concat(parts ...[]byte) []byte {
	return bytes.Join(parts, nil)
}

// topLevel reads the top-level keys of a YAML (or JSON) document.
func topLevel(data []byte) (map[string]any, error) {
	m := map[string]any{}
	if len(bytes.TrimSpace(data)) == 0 {
		return m, nil
	}
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// stringKey is key's value as a string ("" when absent or not a string).
func stringKey(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}

// isJSON says whether a configuration file is JSON, which line edits
// cannot change safely.
func isJSON(data []byte) bool {
	return strings.HasPrefix(strings.TrimSpace(string(data)), "{")
}

// flagValue finds a flag in a command line, as pflag and urfave/cli take
// it: --name=value, --name value, and for each short name -n value.
func flagValue(args []string, names ...string) (string, bool) {
	for i, a := range args {
		for _, n := range names {
			dash := "--"
			if len(n) == 1 {
				dash = "-"
			}
			switch {
			case strings.HasPrefix(a, dash+n+"="):
				return strings.TrimPrefix(a, dash+n+"="), true
			case a == dash+n && i+1 < len(args):
				return args[i+1], true
			}
		}
	}
	return "", false
}

// refuseFlags fails when a command line sets the runtime endpoint by a
// flag: a flag wins over every configuration file, so a file written here
// would change nothing.
func refuseFlags(unit string, args []string) error {
	for _, n := range []string{"container-runtime-endpoint", "image-service-endpoint"} {
		if v, ok := flagValue(args, n); ok {
			return fmt.Errorf("%s runs with --%s=%s: a flag wins over the configuration file the installer writes; "+
				"move the setting into the configuration file (then run the installer again)", unit, n, v)
		}
	}
	return nil
}

// quoteExecArg quotes one argument for a systemd ExecStart= line: double
// quotes, with backslash and quote escaped and the specifiers % and $
// doubled, so systemd passes it on as it is.
func quoteExecArg(a string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `%`, `%%`, `$`, `$$`)
	return `"` + r.Replace(a) + `"`
}
