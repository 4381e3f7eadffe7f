package config

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFieldError(t *testing.T) {
	t.Run("path and message", func(t *testing.T) {
		err := Field("stream", "must be %s, got %d", "positive", -1)
		var fe *FieldError
		require.True(t, errors.As(err, &fe))
		assert.Equal(t, &FieldError{Path: "stream", Msg: "must be positive, got -1"}, fe)
		assert.Equal(t, "stream: must be positive, got -1", err.Error())
	})
	t.Run("empty path prints only the message", func(t *testing.T) {
		assert.Equal(t, "broken", (&FieldError{Msg: "broken"}).Error())
	})
}

func TestErrors(t *testing.T) {
	errs := Errors{
		{Path: "routes[10].sinks", Msg: "c"},
		{Path: "routes[2].sinks", Msg: "b"},
		{Path: "name", Msg: "a"},
	}
	t.Run("printed in order, one per line", func(t *testing.T) {
		assert.Equal(t, "routes[10].sinks: c\nroutes[2].sinks: b\nname: a", errs.Error())
	})
	t.Run("without a file, ordered by path, indexes numerically", func(t *testing.T) {
		sorted := slices.Clone(errs)
		(*origin)(nil).order(sorted)
		assert.Equal(t, "name: a\nroutes[2].sinks: b\nroutes[10].sinks: c", sorted.Error())
	})
	t.Run("printing does not reorder the slice", func(t *testing.T) {
		_ = errs.Error()
		assert.Equal(t, "routes[10].sinks", errs[0].Path)
	})
	t.Run("errors.As reaches each error, also when wrapped", func(t *testing.T) {
		wrapped := fmt.Errorf("loading: %w", errs)
		var fe *FieldError
		require.True(t, errors.As(wrapped, &fe))
		assert.Equal(t, "routes[10].sinks", fe.Path)
		var all Errors
		require.True(t, errors.As(wrapped, &all))
		assert.Len(t, all, 3)
	})
	t.Run("err is nil for no errors", func(t *testing.T) {
		assert.NoError(t, Errors(nil).err())
		assert.Error(t, errs.err())
	})
}

func TestPrefixed(t *testing.T) {
	plain := errors.New("cannot work")
	tests := []struct {
		name string
		err  error
		want []string
	}{
		{"nil", nil, nil},
		{"field error", Field("stream", "must be set"), []string{"sinks.main.config.stream: must be set"}},
		{"index path", Field("[0].name", "x"), []string{"sinks.main.config[0].name: x"}},
		{"empty relative path", Field("", "bad"), []string{"sinks.main.config: bad"}},
		{"plain error", plain, []string{"sinks.main.config: cannot work"}},
		{
			"joined, each prefixed", errors.Join(Field("stream", "must be set"), Field("ack_wait", "must be > 0"), plain),
			[]string{"sinks.main.config.stream: must be set", "sinks.main.config.ack_wait: must be > 0", "sinks.main.config: cannot work"},
		},
		{
			"nested joins", errors.Join(errors.Join(Field("a", "1")), Errors{{Path: "b.c", Msg: "2"}}),
			[]string{"sinks.main.config.a: 1", "sinks.main.config.b.c: 2"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, e := range prefixed("sinks.main.config", tt.err) {
				got = append(got, e.Error())
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestComparePaths(t *testing.T) {
	tests := []struct {
		a, b string
		want int // sign
	}{
		{"routes[2]", "routes[10]", -1},
		{"routes[10]", "routes[2]", 1},
		{"routes[02]", "routes[2]", 0},
		{"a", "b", -1},
		{"name", "name.x", -1},
		{"sinks.a", "sinks.a", 0},
		{"routes[1].sinks[9]", "routes[1].sinks[10]", -1},
	}
	for _, tt := range tests {
		t.Run(tt.a+" vs "+tt.b, func(t *testing.T) {
			got := comparePaths(tt.a, tt.b)
			switch {
			case tt.want < 0:
				assert.Negative(t, got)
			case tt.want > 0:
				assert.Positive(t, got)
			default:
				assert.Zero(t, got)
			}
		})
	}
}
