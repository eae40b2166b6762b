package takeover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The seccomp user-notification interface, written here over x/sys/unix:
// x/sys has the ioctl numbers but not the structs. The structs are encoded
// by hand into buffers of the sizes the kernel reports, as seccomp_unotify(2)
// asks: a kernel whose structs grew writes past ours otherwise.

// Our layouts of the kernel's structs (include/uapi/linux/seccomp.h).
const (
	sizeofSeccompData = 64 // struct seccomp_data: nr, arch, ip, args[6]
	sizeofNotif       = 80 // struct seccomp_notif: id, pid, flags, data
	sizeofNotifResp   = 24 // struct seccomp_notif_resp: id, val, error, flags
	sizeofNotifAddfd  = 24 // struct seccomp_notif_addfd: id, flags, srcfd, newfd, newfd_flags
)

// notifSizes is struct seccomp_notif_sizes, as the running kernel has it.
type notifSizes struct{ notif, resp, data uint16 }

// kernelSizes asks the kernel for its struct sizes (SECCOMP_GET_NOTIF_SIZES)
// and checks that ours are prefixes of them.
func kernelSizes() (notifSizes, error) {
	var b [6]byte
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_NOTIF_SIZES, 0, uintptr(unsafe.Pointer(&b[0]))); e != 0 {
		return notifSizes{}, fmt.Errorf("seccomp user notification sizes: %w", e)
	}
	s := notifSizes{
		notif: binary.NativeEndian.Uint16(b[0:2]),
		resp:  binary.NativeEndian.Uint16(b[2:4]),
		data:  binary.NativeEndian.Uint16(b[4:6]),
	}
	return s, s.check()
}

// check refuses a kernel whose structs are smaller than ours: it does not
// have the fields the agent reads.
func (s notifSizes) check() error {
	if s.notif < sizeofNotif || s.resp < sizeofNotifResp || s.data < sizeofSeccompData {
		return fmt.Errorf("seccomp user notification sizes %d/%d/%d, want at least %d/%d/%d",
			s.notif, s.resp, s.data, sizeofNotif, sizeofNotifResp, sizeofSeccompData)
	}
	return nil
}

// notification is a struct seccomp_notif: one trapped syscall.
type notification struct {
	id   uint64
	pid  int // a thread id in the agent's PID namespace
	nr   int32
	arch uint32
	args [6]uint64
}

func parseNotification(b []byte) notification {
	n := notification{
		id:   binary.NativeEndian.Uint64(b[0:8]),
		pid:  int(binary.NativeEndian.Uint32(b[8:12])),
		nr:   int32(binary.NativeEndian.Uint32(b[16:20])),
		arch: binary.NativeEndian.Uint32(b[20:24]),
	}
	for i := range n.args {
		n.args[i] = binary.NativeEndian.Uint64(b[32+8*i:])
	}
	return n
}

// errGone: the notification is no longer valid (the thread was killed, or
// the syscall was interrupted and will restart as another notification).
var errGone = errors.New("notification no longer valid")

// ioctl calls an ioctl whose argument is a pointer to b.
func ioctl(fd uintptr, req uint, b []byte) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uintptr(req), uintptr(unsafe.Pointer(&b[0])))
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		case unix.ENOENT:
			return errGone
		}
		return e
	}
}

// recv takes the next notification (SECCOMP_IOCTL_NOTIF_RECV). buf is
// the kernel's size of struct seccomp_notif; the kernel wants it zeroed.
func recv(fd uintptr, buf []byte) (notification, error) {
	clear(buf)
	if err := ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_RECV, buf); err != nil {
		return notification{}, err
	}
	return parseNotification(buf), nil
}

// idValid reports whether the thread of notification id still waits in
// the syscall (SECCOMP_IOCTL_NOTIF_ID_VALID): what was read from its
// /proc files belongs to it and not to a thread that reused its id.
func idValid(fd uintptr, id uint64) error {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], id)
	return ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, b[:])
}

// Answers to a notification.
const (
	answerContinue = iota // the kernel runs the syscall as if there were no filter
	answerSuccess         // the syscall returns 0 without running
)

// respond answers notification id (SECCOMP_IOCTL_NOTIF_SEND). size is the
// kernel's size of struct seccomp_notif_resp.
func respond(fd uintptr, size uint16, id uint64, answer int) error {
	b := make([]byte, size)
	binary.NativeEndian.PutUint64(b[0:8], id)
	if answer == answerContinue {
		binary.NativeEndian.PutUint32(b[20:24], unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE)
	}
	return ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_SEND, b)
}

// addFD installs src in the notifying process at fd number target,
// replacing what is there (SECCOMP_IOCTL_NOTIF_ADDFD with
// SECCOMP_ADDFD_FLAG_SETFD: the kernel's own dup2 into another process),
// with O_CLOEXEC when cloexec.
func addFD(fd uintptr, id uint64, src, target int, cloexec bool) error {
	var b [sizeofNotifAddfd]byte
	binary.NativeEndian.PutUint64(b[0:8], id)
	binary.NativeEndian.PutUint32(b[8:12], unix.SECCOMP_ADDFD_FLAG_SETFD)
	binary.NativeEndian.PutUint32(b[12:16], uint32(src))
	binary.NativeEndian.PutUint32(b[16:20], uint32(target))
	if cloexec {
		binary.NativeEndian.PutUint32(b[20:24], unix.O_CLOEXEC)
	}
	return ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_ADDFD, b[:])
}

// isGone reports whether err says the notification or the filter is gone
// (ESRCH: the thread left the syscall before it installed the fd).
func isGone(err error) bool {
	return errors.Is(err, errGone) || errors.Is(err, syscall.EBADF) || errors.Is(err, syscall.ESRCH)
}
