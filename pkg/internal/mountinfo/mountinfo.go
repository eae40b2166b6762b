// Package mountinfo reads the fields of /proc/<pid>/mountinfo (proc(5)):
// the connection hold finds cgroup mounts in it, the installer the mounts
// under the paths it removes.
package mountinfo

import (
	"strconv"
	"strings"
)

// Unescape undoes the octal escapes of a mountinfo path field (\040 for a
// space, \011 for a tab, \012 for a newline, \134 for a backslash).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
