package sinktest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// The conformance cases, each run as a subtest by Run.

func (r *runner) configCase() {
	t := r.t
	require.NotNil(t, r.p.New, "Plugin.New")
	require.NotEmpty(t, r.p.Doc, "Plugin.Doc: one line for `bridge plugins`")
	typ := reflect.TypeOf(r.p.Config)
	require.NotNil(t, typ, "Plugin.Config must be the config struct with its defaults, for `bridge plugins`")
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	require.Equal(t, reflect.Struct, typ.Kind(), "Plugin.Config must be a struct or a pointer to one, got %T", r.p.Config)

	// Round trip: YAML → config → map → config gives the same config.
	dec := func(raw map[string]any) any {
		v := reflect.New(typ)
		if def := reflect.ValueOf(r.p.Config); def.Kind() == reflect.Pointer {
			if !def.IsNil() {
				v.Elem().Set(def.Elem())
			}
		} else {
			v.Elem().Set(def)
		}
		require.NoError(t, (*config.Config)(nil).Decoder(r.path(), raw)(v.Interface()), "decoding into %s", typ)
		return v.Interface()
	}
	first := dec(r.raw)
	enc, ok := encode(reflect.ValueOf(first)).(map[string]any)
	require.True(t, ok)
	second := dec(enc)
	require.Equal(t, first, second, "the config changed in an encode/decode round trip (encoded: %v)", enc)
	require.Equal(t, enc, encode(reflect.ValueOf(second)))

	// The Factory builds an instance from the block, without I/O.
	r.newSink()

	// An unknown key is an error naming its full path.
	bad := maps.Clone(r.raw)
	bad["sinktest_unknown_key"] = true
	s, err := r.p.New((*config.Config)(nil).Decoder(r.path(), bad), r.h.Env)
	if s != nil {
		r.built = append(r.built, s)
	}
	require.Error(t, err, "an unknown key must be an error")
	want := r.path() + ".sinktest_unknown_key"
	require.Contains(t, err.Error(), want)
	require.True(t, hasFieldError(err, want), "no *config.FieldError with Path %q in %v", want, err)
	require.Nil(t, s, "the Factory returned a sink with its error")
}

// hasFieldError reports whether err, or one it wraps, is a *config.FieldError at path.
func hasFieldError(err error, path string) bool {
	var fe *config.FieldError
	if errors.As(err, &fe) && fe.Path == path {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if hasFieldError(e, path) {
				return true
			}
		}
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			return hasFieldError(e, path)
		}
	}
	return false
}

func (r *runner) connectClose() {
	t := r.t
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.newSink().Close(ctx), "Close before Connect")

	s := r.newSink()
	if amo, ok := s.(sinks.AtMostOnce); r.h.AtMostOnce {
		require.True(t, ok && amo.AtMostOnce(), "Harness.AtMostOnce is set: the sink must implement sinks.AtMostOnce returning true")
	} else if ok {
		require.False(t, amo.AtMostOnce(), "the sink says it is at-most-once: set Harness.AtMostOnce")
	}
	r.connect(s)
	require.NoError(t, s.Connect(ctx), "a second Connect")
	require.NoError(t, s.Write(ctx, nil), "an empty Write")
	batch := Changes(6, r.producer)
	r.write(s, batch[:3])
	r.eventually(r.exactly(batch[:3]))
	require.NoError(t, s.Close(ctx), "Close")
	require.NoError(t, s.Close(ctx), "a second Close")
	require.Error(t, s.Write(ctx, batch[3:]), "a Write after Close")
}

func (r *runner) ordered() {
	s := r.newSink()
	r.connect(s)
	all := Changes(60, r.producer)
	for _, b := range [][2]int{{0, 1}, {1, 8}, {8, 48}, {48, 50}, {50, 60}} {
		r.write(s, all[b[0]:b[1]])
	}
	got := r.eventually(r.exactly(all))
	r.checkContent(got, all)
}

// partialFailure: a Write to the broken destination fails, honestly.
func (r *runner) partialFailure() {
	t := r.t
	s := r.newSink()
	r.connect(s)
	all := Changes(60, r.producer)
	a, b, c := all[:20], all[20:40], all[40:]
	r.write(s, a)
	r.eventually(r.exactly(a))

	r.brk()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	err := s.Write(ctx, b)
	cancel()
	require.Error(t, err, "Write to a broken destination")
	require.False(t, sinks.IsPermanent(err), "a broken destination is not a permanent failure: %v", err)
	r.heal()
	retried := r.recover(s, all, a, b, r.failed(err, b))
	r.deliver(s, c)
	if r.h.AtMostOnce {
		r.final(all, a, retried, c) // a arrived before Break
	} else {
		r.final(all, a, b, c)
	}
}

// breakDuringWrite: Break lands while a large Write is under way.
func (r *runner) breakDuringWrite() {
	t := r.t
	s := r.newSink()
	r.connect(s)
	all := Changes(420, r.producer)
	big, tail := all[:400], all[400:]

	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
		defer cancel()
		errc <- s.Write(ctx, big)
	}()
	var err error
	done := false
	r.eventually(func(got []Received) error {
		select {
		case err = <-errc:
			done = true
			return nil
		default:
		}
		if len(got) == 0 {
			return errors.New("nothing of the large Write arrived")
		}
		return nil
	})
	r.brk()
	if !done {
		select {
		case err = <-errc:
		case <-time.After(15 * time.Second):
			t.Fatal("Write did not return within 15s of Break (its deadline was 10s)")
		}
	}
	require.False(t, sinks.IsPermanent(err), "a broken destination is not a permanent failure: %v", err)
	r.heal()
	retried := r.recover(s, all, nil, big, r.failed(err, big))
	r.deliver(s, tail)
	if r.h.AtMostOnce {
		r.final(all, retried, tail)
	} else {
		r.final(all, big, tail)
	}
}

// recover runs after Heal: it checks that what the failed Write of batch
// did not list arrived (unless at-most-once), then retries the rest and
// returns it.
func (r *runner) recover(s sinks.Sink, all, before, batch []cdc.Change, failed []int) []cdc.Change {
	r.t.Helper()
	r.connect(s)
	if !r.h.AtMostOnce {
		var unlisted []cdc.Change
		for i := range batch {
			if !slices.Contains(failed, i) {
				unlisted = append(unlisted, batch[i])
			}
		}
		got := r.eventually(r.has(all, before, unlisted))
		r.checkContent(got, all)
	}
	retried := pick(batch, failed)
	r.deliver(s, retried)
	return retried
}

// final checks the outcome of a failure case: every change of need
// arrived, first arrivals in the order of all, once each if the
// destination dedupes.
func (r *runner) final(all []cdc.Change, need ...[]cdc.Change) {
	r.t.Helper()
	if r.h.Mirror != nil && !r.h.AtMostOnce {
		// Everything was delivered in the end, in the order of all.
		got := r.eventually(r.exactly(all))
		r.checkContent(got, all)
		return
	}
	got := r.eventually(r.has(all, need...))
	r.checkContent(got, all)
	if r.h.Dedupes && r.h.Mirror == nil {
		r.checkOnce(got)
	}
}

func (r *runner) closeDeadline() {
	t := r.t
	s := r.newSink()
	r.connect(s)
	all := Changes(10, r.producer)
	r.write(s, all[:5])
	r.eventually(r.exactly(all[:5]))

	if r.h.Break != nil {
		r.brk()
		ctx, cancel := context.WithTimeout(t.Context(), shortDeadline)
		start := time.Now()
		err := s.Write(ctx, all[5:])
		took := time.Since(start)
		cancel()
		require.Error(t, err, "Write to a broken destination")
		require.Less(t, took, shortDeadline+slack, "Write to a broken destination took %s with a %s deadline", took, shortDeadline)
	}
	ctx, cancel := context.WithTimeout(t.Context(), shortDeadline)
	start := time.Now()
	_ = s.Close(ctx)
	took := time.Since(start)
	cancel()
	require.Less(t, took, shortDeadline+slack, "Close took %s with a %s deadline", took, shortDeadline)

	if r.broken {
		fresh := r.newSink()
		ctx, cancel := context.WithTimeout(t.Context(), shortDeadline)
		start := time.Now()
		_ = fresh.Connect(ctx)
		took := time.Since(start)
		cancel()
		require.Less(t, took, shortDeadline+slack, "Connect to a broken destination took %s with a %s deadline", took, shortDeadline)
		ctx, cancel = context.WithTimeout(t.Context(), shortDeadline)
		start = time.Now()
		_ = fresh.Close(ctx)
		took = time.Since(start)
		cancel()
		require.Less(t, took, shortDeadline+slack, "Close of a fresh instance took %s with a %s deadline", took, shortDeadline)
		r.heal()
	}
}

func (r *runner) replay() {
	s := r.newSink()
	r.connect(s)
	batch := Changes(30, r.producer)
	r.write(s, batch)
	r.write(s, batch)
	if r.h.Dedupes {
		again := r.newSink() // a restarted bridge
		r.connect(again)
		r.write(again, batch[10:20])
		got := r.eventually(r.exactly(batch))
		r.checkContent(got, batch)
		return
	}
	if r.h.Mirror != nil { // written twice, in order: the rows are as after once
		got := r.eventually(r.exactly(batch))
		r.checkContent(got, batch)
		return
	}
	got := r.eventually(has(batch))
	r.checkContent(got, batch)
}

// encode turns a decoded config back into the YAML tree it came from, by
// koanf tags: durations and encoding.TextMarshaler values as text.
func encode(v reflect.Value) any {
	if !v.IsValid() {
		return nil
	}
	if v.Type() == reflect.TypeFor[time.Duration]() {
		return time.Duration(v.Int()).String()
	}
	if text, ok := marshalText(v); ok {
		return text
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return encode(v.Elem())
	case reflect.Struct:
		out := map[string]any{}
		encodeStruct(v, out)
		return out
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		out := make(map[string]any, v.Len())
		it := v.MapRange()
		for it.Next() {
			out[fmt.Sprint(it.Key().Interface())] = encode(it.Value())
		}
		return out
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			return nil
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = encode(v.Index(i))
		}
		return out
	}
	return v.Interface()
}

// encodeStruct adds the fields of struct v to out, as config.Decoder reads them.
func encodeStruct(v reflect.Value, out map[string]any) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if name == "-" {
			continue
		}
		fv := v.Field(i)
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && ft.Kind() == reflect.Struct && (name == "" || slices.Contains(strings.Split(opts, ","), "squash")) {
			if fv.Kind() == reflect.Pointer {
				if fv.IsNil() {
					continue
				}
				fv = fv.Elem()
			}
			encodeStruct(fv, out)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		if _, dup := out[name]; !dup {
			out[name] = encode(fv)
		}
	}
}

// marshalText returns v's text if v (or a pointer to it) implements
// encoding.TextMarshaler.
func marshalText(v reflect.Value) (string, bool) {
	type textMarshaler interface{ MarshalText() ([]byte, error) }
	if v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		return "", false
	}
	p := reflect.New(v.Type())
	p.Elem().Set(v)
	m, ok := p.Interface().(textMarshaler)
	if !ok {
		return "", false
	}
	b, err := m.MarshalText()
	if err != nil {
		return "", false
	}
	return string(b), true
}
