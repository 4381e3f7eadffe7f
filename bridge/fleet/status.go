package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/internal/kvkey"
)

// Status is a fleet as its bucket shows it.
type Status struct {
	Fleet   string         `json:"fleet"`
	Bucket  string         `json:"bucket"`
	Members []MemberStatus `json:"members"`
	Leases  []LeaseStatus  `json:"leases"`
}

// MemberStatus is one member's key.
type MemberStatus struct {
	MemberInfo
	// Age is how long ago it last wrote its key, by its own clock's
	// timestamp; Live is false when that is more than its lease (it is
	// gone: killed, or cut off from NATS).
	Age  string `json:"age"`
	Live bool   `json:"live"`
}

// LeaseStatus is one source's lease.
type LeaseStatus struct {
	Source string `json:"source"`
	Lease
	Revision uint64 `json:"revision"`
	Age      string `json:"age"` // since its last renewal, by the owner's timestamp
}

// ReadStatus reads fleet's bucket: its members and leases, sorted. It
// reads what the members wrote; a member's or lease's age comes from the
// writer's wall clock, so it is approximate across machines.
func ReadStatus(ctx context.Context, js jetstream.JetStream, fleet string) (Status, error) {
	st := Status{Fleet: fleet, Bucket: Bucket(fleet), Members: []MemberStatus{}, Leases: []LeaseStatus{}}
	kv, err := js.KeyValue(ctx, st.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return st, fmt.Errorf("fleet %s has no bucket %s: no member ever ran (bridge run --fleet %s)", fleet, st.Bucket, fleet)
	}
	if err != nil {
		return st, fmt.Errorf("fleet %s: opening bucket %s: %w", fleet, st.Bucket, err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return st, fmt.Errorf("fleet %s: listing bucket %s: %w", fleet, st.Bucket, err)
	}
	now := time.Now()
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // deleted meanwhile
		}
		switch {
		case strings.HasPrefix(k, memberPrefix):
			var mi MemberInfo
			if json.Unmarshal(e.Value(), &mi) == nil {
				age := now.Sub(mi.Renewed)
				st.Members = append(st.Members, MemberStatus{MemberInfo: mi, Age: age.Round(time.Millisecond).String(), Live: age <= time.Duration(mi.LeaseMS)*time.Millisecond})
			}
		case strings.HasPrefix(k, leasePrefix):
			src, err := kvkey.Unescape(strings.TrimPrefix(k, leasePrefix))
			var l Lease
			if err == nil && json.Unmarshal(e.Value(), &l) == nil {
				st.Leases = append(st.Leases, LeaseStatus{Source: src, Lease: l, Revision: e.Revision(), Age: now.Sub(l.Renewed).Round(time.Millisecond).String()})
			}
		}
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].Member < st.Members[j].Member })
	sort.Slice(st.Leases, func(i, j int) bool { return st.Leases[i].Source < st.Leases[j].Source })
	return st, nil
}
