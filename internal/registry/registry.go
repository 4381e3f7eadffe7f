// Package registry is the generic name → plugin table behind sources.Registry
// and sinks.Registry.
package registry

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Registry maps plugin type names to plugins. It is safe for concurrent use.
type Registry[P any] struct {
	kind string
	mu   sync.RWMutex
	m    map[string]P
}

// New returns an empty registry; kind ("sink", "source") names it in errors.
func New[P any](kind string) *Registry[P] {
	return &Registry[P]{kind: kind, m: map[string]P{}}
}

// Register adds p under typ; a duplicate or empty name is an error naming typ.
func (r *Registry[P]) Register(typ string, p P) error {
	if typ == "" {
		return fmt.Errorf("registering %s: empty type name", r.kind)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[typ]; dup {
		return fmt.Errorf("registering %s type %q: already registered", r.kind, typ)
	}
	r.m[typ] = p
	return nil
}

// Lookup returns the plugin registered as typ; an unknown type is an error
// listing the known ones.
func (r *Registry[P]) Lookup(typ string) (P, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p, ok := r.m[typ]
	if !ok {
		var zero P
		known := r.typesLocked()
		list := "none"
		if len(known) > 0 {
			list = strings.Join(known, ", ")
		}
		return zero, fmt.Errorf("unknown %s type %q (compiled in: %s)", r.kind, typ, list)
	}
	return p, nil
}

// Types returns the registered type names, sorted.
func (r *Registry[P]) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.typesLocked()
}

func (r *Registry[P]) typesLocked() []string {
	out := make([]string, 0, len(r.m))
	for k := range r.m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
