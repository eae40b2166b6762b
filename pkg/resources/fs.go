package resources

import (
	"fmt"
	"os"
)

// FS is the only way this package touches cgroup files. The real system uses
// OSFS; tests wrap it (or replace it) to record the order of writes and to make
// the N-th write fail, which is how "write 2 of 3 failed" becomes a unit test.
type FS interface {
	// ReadFile returns the whole content of a cgroup file.
	ReadFile(path string) ([]byte, error)
	// WriteFile replaces the content of an existing cgroup file.
	WriteFile(path string, data []byte) error
}

// OSFS returns the FS backed by the operating system.
func OSFS() FS { return osFS{} }

type osFS struct{}

func (osFS) ReadFile(path string) ([]byte, error) { return os.ReadFile(path) }

// WriteFile opens without O_CREATE: a cgroup file that is missing means a wrong
// path or a disabled controller, and on a fake tree we want that to fail the
// same way it fails on cgroupfs instead of quietly creating a regular file.
func (osFS) WriteFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	// The kernel reports a rejected value on write(2), not on close(2), but a
	// close error on a regular file (fake tree) still means the data is lost.
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}
