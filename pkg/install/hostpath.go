package install

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// maxLinks bounds the symbolic links followed for one path, as the
// kernel's ELOOP does.
const maxLinks = 40

// hostPath is where host path p is under root, its symbolic links
// followed as the host would follow them: an absolute link target is a
// host path, so it goes under root again instead of escaping into the
// installer's own filesystem (/host/usr/local → /var/usrlocal is
// /host/var/usrlocal). With keepLast the last component is not followed:
// removing a link removes the link. Components that do not exist are kept
// as they are.
func hostPath(root, p string, keepLast bool) (string, error) {
	todo := strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/")
	cur := "/"
	for links := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		if c == "" || c == "." {
			continue
		}
		next := path.Join(cur, c)
		if keepLast && len(todo) == 0 {
			cur = next
			break
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTDIR) {
				cur = next // not there, or not a link
				continue
			}
			return "", err
		}
		if links++; links > maxLinks {
			return "", &fs.PathError{Op: "resolve", Path: p, Err: errors.New("too many levels of symbolic links")}
		}
		if !path.IsAbs(target) {
			target = path.Join(cur, target)
		}
		todo = append(strings.Split(strings.Trim(path.Clean(target), "/"), "/"), todo...)
		cur = "/"
	}
	return filepath.Join(root, cur), nil
}
