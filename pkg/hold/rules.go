package hold

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/inplaced/inplaced/pkg/internal/netns"
)

// TablePrefix starts the name of every table this package makes; recovery
// deletes tables by it.
const TablePrefix = "inplaced_hold"

// ruleset is the hold's nftables state in one netns, made and changed over
// one lasting netlink socket: the owner of its tables.
type ruleset struct {
	c      *nftables.Conn
	tables []*nftables.Table
	rules  map[uint16][]*nftables.Rule // by port
	compat bool                        // xtables NFQUEUE through nft_compat
	owner  bool                        // tables carry the owner flag
}

// action is what a rule does with a port's SYN: queue on num, or drop.
type action struct {
	drop bool
	num  map[uint16]uint16 // port → queue number
}

// synMatch matches a TCP SYN (no ACK) to port.
func synMatch(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x12}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x02}},
	}
}

// xtNFQueueV3 is struct xt_NFQ_info_v3 {queuenum, queues_total, flags}
// (host order), padded to XT_ALIGN: NFQUEUE num, 1 queue, bypass.
func xtNFQueueV3(num uint16) *xt.Unknown {
	b := make([]byte, 8)
	copy(b[0:2], binaryutil.NativeEndian.PutUint16(num))
	copy(b[2:4], binaryutil.NativeEndian.PutUint16(1))
	copy(b[4:6], binaryutil.NativeEndian.PutUint16(1)) // NFQ_FLAG_BYPASS
	u := xt.Unknown(b)
	return &u
}

func (a action) verdict(port uint16, compat bool) expr.Any {
	switch {
	case a.drop:
		return &expr.Verdict{Kind: expr.VerdictDrop}
	case compat:
		return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: xtNFQueueV3(a.num[port])}
	default:
		// bypass: with nobody bound to the queue, SYNs pass as if there
		// were no rule (the instant between our socket closing and the
		// kernel deleting the owner's table).
		return &expr.Queue{Num: a.num[port], Total: 1, Flag: expr.QueueFlagBypass}
	}
}

// install creates table name in ns with one input chain and one rule per
// port, as one netlink transaction (all or nothing). It tries the native
// queue expression in an inet table first, then the compat target in an ip
// and an ip6 table; and the owner flag first, then (kernel < 5.12) none.
func install(ns *os.File, name string, ports []uint16, a action) (*ruleset, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())), nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	var errs []error
	for _, try := range []struct{ compat, owner bool }{{false, true}, {true, true}, {false, false}, {true, false}} {
		if try.compat && a.drop {
			continue
		}
		rs := &ruleset{c: c, rules: map[uint16][]*nftables.Rule{}, compat: try.compat, owner: try.owner}
		err := rs.add(name, ports, a)
		if err == nil {
			return rs, nil
		}
		errs = append(errs, fmt.Errorf("compat=%v owner=%v: %w", try.compat, try.owner, err))
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.EPERM) {
			break // a table of that name exists: another hold in this netns
		}
	}
	_ = c.CloseLasting()
	return nil, fmt.Errorf("install %s: %w", name, errors.Join(errs...))
}

func (rs *ruleset) add(name string, ports []uint16, a action) error {
	fams := []nftables.TableFamily{nftables.TableFamilyINet}
	if rs.compat {
		fams = []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6}
	}
	var flags nftables.TableFlags
	if rs.owner {
		flags = nftables.TableFlagOwner
	}
	for _, fam := range fams {
		t := rs.c.CreateTable(&nftables.Table{Name: name, Family: fam, Flags: flags})
		ch := rs.c.AddChain(&nftables.Chain{
			Name: "hold", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter,
		})
		for _, p := range ports {
			r := rs.c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(synMatch(p), a.verdict(p, rs.compat))})
			rs.rules[p] = append(rs.rules[p], r)
		}
		rs.tables = append(rs.tables, t)
	}
	return rs.c.Flush()
}

// unhold deletes the rules of port: no new SYN for it is parked from now.
func (rs *ruleset) unhold(port uint16) error {
	for _, r := range rs.rules[port] {
		if err := rs.c.DelRule(r); err != nil {
			return err
		}
	}
	delete(rs.rules, port)
	return rs.c.Flush()
}

// remove deletes the tables and closes the socket. Call only when nothing
// is parked any more: the chain's hook goes with them, and the kernel drops
// what is still queued in the netns.
func (rs *ruleset) remove() error {
	for _, t := range rs.tables {
		rs.c.DelTable(t)
	}
	err := rs.c.Flush()
	if cerr := rs.c.CloseLasting(); err == nil {
		err = cerr
	}
	return err
}

// Remove deletes every table of this package in the network namespace at
// netnsPath (recovery after a crash on a kernel without the owner flag; on
// others the kernel did it already). A missing namespace or table is no
// error.
func Remove(netnsPath string) (removed []string, err error) {
	ns, err := netns.Open(netnsPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		return nil, fmt.Errorf("list tables in %s: %w", netnsPath, err)
	}
	for _, t := range tables {
		if strings.HasPrefix(t.Name, TablePrefix) {
			c.DelTable(t)
			removed = append(removed, t.Name)
		}
	}
	if len(removed) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("delete %v in %s: %w", removed, netnsPath, err)
	}
	return removed, nil
}
