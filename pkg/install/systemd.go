package install

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// DBusSystemd is the host's systemd over its private D-Bus socket,
// /run/systemd/private under the host root.
//
// Why D-Bus and not `nsenter -t 1 -m systemctl` (or chroot /host
// systemctl): the installer image holds static Go binaries and no
// util-linux; a Go process cannot enter another mount namespace itself
// (setns(CLONE_NEWNS) refuses a multithreaded caller); systemctl's output
// is text to parse and its exit codes say little; and running the host's
// own systemctl ties the installer to the host's binaries and libraries.
// The private socket is what systemctl itself uses as root, needs no
// dbus-daemon (minimal edge hosts run without one), authenticates the
// pod's uid 0 as the host's (a privileged pod shares the host's user
// namespace), and returns typed properties and each job's result.
type DBusSystemd struct {
	conn *sddbus.Conn
}

var _ Systemd = (*DBusSystemd)(nil)

// DialSystemd connects to the systemd of the host whose root is root.
func DialSystemd(ctx context.Context, root string) (*DBusSystemd, error) {
	sock := filepath.Join(root, "run/systemd/private")
	conn, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
		c, err := godbus.Dial("unix:path="+sock, godbus.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		// EXTERNAL with the numeric uid, as go-systemd does for its own
		// private connection (no user lookup in a static binary). No Hello:
		// the private socket is systemd itself, not a bus.
		if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("systemd's private socket %s: %w", sock, err)
	}
	return &DBusSystemd{conn: conn}, nil
}

// Close ends the connection.
func (d *DBusSystemd) Close() { d.conn.Close() }

func (d *DBusSystemd) Reload(ctx context.Context) error { return d.conn.ReloadContext(ctx) }

func (d *DBusSystemd) Enable(ctx context.Context, units []string) error {
	_, _, err := d.conn.EnableUnitFilesContext(ctx, units, false, true)
	return err
}

func (d *DBusSystemd) Disable(ctx context.Context, units []string) error {
	_, err := d.conn.DisableUnitFilesContext(ctx, units, false)
	return ignoreNoSuchUnit(err)
}

func (d *DBusSystemd) Start(ctx context.Context, unit string) error {
	return d.job(ctx, unit, "start", d.conn.StartUnitContext)
}

func (d *DBusSystemd) Stop(ctx context.Context, unit string) error {
	return ignoreNoSuchUnit(d.job(ctx, unit, "stop", d.conn.StopUnitContext))
}

func (d *DBusSystemd) Restart(ctx context.Context, unit string) error {
	return d.job(ctx, unit, "restart", d.conn.RestartUnitContext)
}

func (d *DBusSystemd) ResetFailed(ctx context.Context, unit string) error {
	return ignoreNoSuchUnit(d.conn.ResetFailedUnitContext(ctx, unit))
}

type jobFunc func(ctx context.Context, name, mode string, ch chan<- string) (int, error)

// job queues a job and waits for its result, as systemctl does.
func (d *DBusSystemd) job(ctx context.Context, unit, what string, fn jobFunc) error {
	ch := make(chan string, 1)
	if _, err := fn(ctx, unit, "replace", ch); err != nil {
		return err
	}
	select {
	case r := <-ch:
		if r != "done" {
			return fmt.Errorf("%s %s: job %s (journalctl -u %s says why)", what, unit, r, unit)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s %s: %w", what, unit, ctx.Err())
	}
}

// Unit reads a unit's state; a unit systemd does not know is "not-found".
func (d *DBusSystemd) Unit(ctx context.Context, name string) (UnitState, error) {
	props, err := d.conn.GetUnitPropertiesContext(ctx, name)
	if err != nil {
		return UnitState{}, err
	}
	st := UnitState{Load: str(props["LoadState"]), Active: str(props["ActiveState"]), FileState: str(props["UnitFileState"])}
	if filepath.Ext(name) != ".service" || st.Load != "loaded" {
		return st, nil
	}
	sp, err := d.conn.GetUnitTypePropertiesContext(ctx, name, "Service")
	if err != nil {
		return st, err
	}
	st.MainPID, _ = sp["MainPID"].(uint32)
	st.Started, _ = sp["ExecMainStartTimestampMonotonic"].(uint64)
	return st, nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// ignoreNoSuchUnit drops systemd's "unit not loaded": stopping, disabling
// or forgetting a unit that is not there has nothing to do.
func ignoreNoSuchUnit(err error) error {
	const noSuchUnit = "org.freedesktop.systemd1.NoSuchUnit"
	var v godbus.Error
	var p *godbus.Error
	if (errors.As(err, &v) && v.Name == noSuchUnit) || (errors.As(err, &p) && p.Name == noSuchUnit) {
		return nil
	}
	return err
}
