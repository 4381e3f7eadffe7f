package pluginsink

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bridgecdc/bridge/sinks/pluginsink/pluginv1"
)

// ErrNoConformance is returned by Read, Break and Heal when the plugin does
// not serve that part of the Conformance service.
var ErrNoConformance = errors.New("the plugin does not serve bridge.plugin.v1.Conformance")

// Read returns what the plugin's destination holds, through its
// Conformance service (for `bridge plugin test`).
func (s *Sink) Read(ctx context.Context) ([]*pluginv1.Record, error) {
	p, err := s.conformance()
	if err != nil {
		return nil, err
	}
	r, err := p.conf.Read(ctx, &pluginv1.ReadRequest{})
	if err != nil {
		return nil, s.confErr("Read", err)
	}
	return r.GetRecords(), nil
}

// Break makes the plugin's destination fail until Heal.
func (s *Sink) Break(ctx context.Context) error {
	p, err := s.conformance()
	if err != nil {
		return err
	}
	_, err = p.conf.Break(ctx, &pluginv1.BreakRequest{})
	return s.confErr("Break", err)
}

// Heal undoes Break.
func (s *Sink) Heal(ctx context.Context) error {
	p, err := s.conformance()
	if err != nil {
		return err
	}
	_, err = p.conf.Heal(ctx, &pluginv1.HealRequest{})
	return s.confErr("Heal", err)
}

// CanBreak reports whether the plugin serves Break and Heal: it calls Heal.
func (s *Sink) CanBreak(ctx context.Context) bool {
	return !errors.Is(s.Heal(ctx), ErrNoConformance)
}

func (s *Sink) conformance() (*proc, error) {
	p, err := s.current()
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, fmt.Errorf("%s: not running", who(s.name, s.cfg.Command))
	}
	return p, nil
}

func (s *Sink) confErr(rpc string, err error) error {
	if err == nil {
		return nil
	}
	if status.Code(err) == codes.Unimplemented {
		return fmt.Errorf("%s: %s: %w", who(s.name, s.cfg.Command), rpc, ErrNoConformance)
	}
	return fmt.Errorf("%s: %s: %w", who(s.name, s.cfg.Command), rpc, err)
}
