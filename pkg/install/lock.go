package install

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Lock takes the host's installer lock, waiting for another installer on
// the same node (an old pod still terminating while its successor starts)
// to finish. The returned function releases it; with remove, it also
// deletes the lock file (an uninstall leaves nothing behind).
func Lock(root string) (unlock func(remove bool), err error) {
	p := filepath.Join(root, LockPath)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("installer lock %s: %w", LockPath, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("installer lock %s: %w", LockPath, err)
	}
	return func(remove bool) {
		if remove {
			_ = os.Remove(p)
		}
		_ = f.Close()
	}, nil
}
