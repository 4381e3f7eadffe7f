package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// level is a TextUnmarshaler with its own error.
type level int

func (l *level) UnmarshalText(b []byte) error {
	switch string(b) {
	case "low":
		*l = 1
	case "high":
		*l = 2
	default:
		return fmt.Errorf("unknown level %q", b)
	}
	return nil
}

type tlsConfig struct {
	CA       string `koanf:"ca"`
	Insecure bool   `koanf:"insecure"`
}

type limit struct {
	Max  int           `koanf:"max"`
	Wait time.Duration `koanf:"wait"`
}

type common struct {
	Retries int `koanf:"retries"`
}

// pluginConfig is a plugin's config struct exercising every decoding rule.
type pluginConfig struct {
	common                         // squashed
	URL      string                `koanf:"url"`
	Stream   string                `koanf:"stream"`
	AckWait  time.Duration         `koanf:"ack_wait"`
	Addr     netip.Addr            `koanf:"addr"`
	Level    level                 `koanf:"level"`
	TLS      *tlsConfig            `koanf:"tls"`
	Headers  map[string]string     `koanf:"headers"`
	Limits   map[string]limit      `koanf:"limits"`
	Subjects []string              `koanf:"subjects"`
	Pair     [2]int                `koanf:"pair"`
	Tables   []tlsConfig           `koanf:"tables"`
	Extra    map[string]any        `koanf:"extra"`
	Any      any                   `koanf:"any"`
	Ratio    float64               `koanf:"ratio"`
	Small    int8                  `koanf:"small"`
	Count    uint                  `koanf:"count"`
	Waits    map[string]*time.Time `koanf:"-"`
	Untagged string
	internal string
}

// Validate reports stream and ack_wait, joined, with relative paths.
func (c *pluginConfig) Validate() error {
	var errs []error
	if c.Stream == "" {
		errs = append(errs, Field("stream", "must be set"))
	}
	if c.AckWait <= 0 {
		errs = append(errs, Field("ack_wait", "must be > 0, got %s", c.AckWait))
	}
	if c.URL == "fail" {
		errs = append(errs, errors.New("cannot use url fail"))
	}
	for i, tb := range c.Tables {
		if tb.CA == "" {
			errs = append(errs, Field(fmt.Sprintf("tables[%d].ca", i), "must be set"))
		}
	}
	return errors.Join(errs...)
}

func defaultPlugin() pluginConfig {
	return pluginConfig{
		URL: "nats://127.0.0.1:4222", AckWait: 5 * time.Second, Level: 1,
		Headers: map[string]string{"x-default": "1"},
	}
}

func TestDecoder(t *testing.T) {
	const path = "sinks.main.config"

	t.Run("decodes every kind and keeps defaults for absent keys", func(t *testing.T) {
		cfg := defaultPlugin()
		err := (*Config)(nil).Decoder(path, map[string]any{
			"stream":   "CDC",
			"addr":     "10.0.0.1",
			"level":    "high",
			"retries":  3,
			"tls":      map[string]any{"ca": "/ca.pem"},
			"headers":  map[string]any{"x-extra": "2"},
			"limits":   map[string]any{"a": map[string]any{"max": 5, "wait": "1s"}},
			"subjects": []any{"a.>", "b.*"},
			"pair":     []any{1, 2},
			"tables":   []any{map[string]any{"ca": "x", "insecure": true}},
			"extra":    map[string]any{"n": 1, "l": []any{"x"}},
			"any":      []any{1, "two"},
			"ratio":    2,
			"small":    -8,
			"count":    7,
			"untagged": "u",
			"url":      nil, // null: the default stays
		})(&cfg)
		require.NoError(t, err)
		want := pluginConfig{
			common:   common{Retries: 3},
			URL:      "nats://127.0.0.1:4222",
			Stream:   "CDC",
			AckWait:  5 * time.Second,
			Addr:     netip.MustParseAddr("10.0.0.1"),
			Level:    2,
			TLS:      &tlsConfig{CA: "/ca.pem"},
			Headers:  map[string]string{"x-default": "1", "x-extra": "2"},
			Limits:   map[string]limit{"a": {Max: 5, Wait: time.Second}},
			Subjects: []string{"a.>", "b.*"},
			Pair:     [2]int{1, 2},
			Tables:   []tlsConfig{{CA: "x", Insecure: true}},
			Extra:    map[string]any{"n": 1, "l": []any{"x"}},
			Any:      []any{1, "two"},
			Ratio:    2,
			Small:    -8,
			Count:    7,
			Untagged: "u",
		}
		assert.Equal(t, want, cfg)
	})

	t.Run("map entries decode onto existing ones", func(t *testing.T) {
		cfg := defaultPlugin()
		cfg.Limits = map[string]limit{"a": {Max: 1, Wait: time.Second}, "b": {Max: 2}}
		raw := map[string]any{"stream": "CDC", "limits": map[string]any{"a": map[string]any{"max": 5}}}
		require.NoError(t, (*Config)(nil).Decoder(path, raw)(&cfg))
		assert.Equal(t, map[string]limit{"a": {Max: 5, Wait: time.Second}, "b": {Max: 2}}, cfg.Limits)
	})

	t.Run("does not modify the caller's maps", func(t *testing.T) {
		shared := map[string]string{"x-default": "1"}
		raw := map[string]any{"stream": "CDC", "headers": map[string]any{"x-extra": "2"}, "extra": map[string]any{"k": "v"}}
		cfg := defaultPlugin()
		cfg.Headers = shared
		require.NoError(t, (*Config)(nil).Decoder(path, raw)(&cfg))
		assert.Equal(t, map[string]string{"x-default": "1"}, shared)
		cfg.Extra["k"] = "changed"
		assert.Equal(t, "v", raw["extra"].(map[string]any)["k"])
	})

	errorCases := []struct {
		name string
		raw  map[string]any
		want []string
	}{
		{"unknown key lists the known ones", map[string]any{"stream": "CDC", "subjcet": "x"},
			[]string{path + ".subjcet: unknown key (known: ack_wait, addr, any, count, extra, headers, level, limits, pair, ratio, retries, small, stream, subjects, tables, tls, untagged, url)"}},
		{"unknown key in a pointer struct", map[string]any{"stream": "CDC", "tls": map[string]any{"cert": "x"}},
			[]string{path + ".tls.cert: unknown key (known: ca, insecure)"}},
		{"unknown key in a map value", map[string]any{"stream": "CDC", "limits": map[string]any{"a": map[string]any{"mx": 1}}},
			[]string{path + ".limits.a.mx: unknown key (known: max, wait)"}},
		{"unknown key in a list element", map[string]any{"stream": "CDC", "tables": []any{map[string]any{"ca": "x"}, map[string]any{"ca": "y", "kc": 1}}},
			[]string{path + ".tables[1].kc: unknown key (known: ca, insecure)"}},
		{"skipped fields are unknown keys", map[string]any{"stream": "CDC", "waits": map[string]any{}, "internal": "x"},
			[]string{
				path + ".internal: unknown key (known: ack_wait, addr, any, count, extra, headers, level, limits, pair, ratio, retries, small, stream, subjects, tables, tls, untagged, url)",
				path + ".waits: unknown key (known: ack_wait, addr, any, count, extra, headers, level, limits, pair, ratio, retries, small, stream, subjects, tables, tls, untagged, url)",
			}},
		{"bad duration", map[string]any{"stream": "CDC", "ack_wait": "5x"}, []string{path + `.ack_wait: time: unknown unit "x" in duration "5x"`}},
		{"duration from a number", map[string]any{"stream": "CDC", "ack_wait": 5}, []string{path + `.ack_wait: expected a duration such as "50ms" or "2s", got an integer`}},
		{"duration in a map value", map[string]any{"stream": "CDC", "limits": map[string]any{"b": map[string]any{"wait": "soon"}}},
			[]string{path + `.limits.b.wait: time: invalid duration "soon"`}},
		{"TextUnmarshaler error", map[string]any{"stream": "CDC", "level": "medium"}, []string{path + `.level: unknown level "medium"`}},
		{"TextUnmarshaler from a number", map[string]any{"stream": "CDC", "level": 2}, []string{path + ".level: expected a string, got an integer"}},
		{"netip error", map[string]any{"stream": "CDC", "addr": "10.0.0"}, []string{path + `.addr: ParseAddr("10.0.0"): IPv4 address too short`}},
		{"no weak typing: string to int", map[string]any{"stream": "CDC", "retries": "5"}, []string{path + ".retries: expected an integer, got a string"}},
		{"no weak typing: int to string", map[string]any{"stream": 5}, []string{path + ".stream: expected a string, got an integer"}},
		{"no weak typing: string to bool", map[string]any{"stream": "CDC", "tls": map[string]any{"insecure": "true"}},
			[]string{path + ".tls.insecure: expected a boolean, got a string"}},
		{"no weak typing: scalar to list", map[string]any{"stream": "CDC", "subjects": "a.>"}, []string{path + ".subjects: expected a list, got a string"}},
		{"wrong type in a list", map[string]any{"stream": "CDC", "subjects": []any{"a", 2}}, []string{path + ".subjects[1]: expected a string, got an integer"}},
		{"array length", map[string]any{"stream": "CDC", "pair": []any{1}}, []string{path + ".pair: expected a list of 2 items, got 1"}},
		{"overflow", map[string]any{"stream": "CDC", "small": 300}, []string{path + ".small: integer out of range for int8"}},
		{"negative unsigned", map[string]any{"stream": "CDC", "count": -1}, []string{path + ".count: expected a non-negative integer, got a negative one"}},
		{"string for a float", map[string]any{"stream": "CDC", "ratio": "1.5"}, []string{path + ".ratio: expected a number, got a string"}},
		{"Validate errors are prefixed, each one", map[string]any{"ack_wait": "0s"},
			[]string{path + ".ack_wait: must be > 0, got 0s", path + ".stream: must be set"}},
		{"Validate plain errors land on the block", map[string]any{"stream": "CDC", "url": "fail"},
			[]string{path + ": cannot use url fail"}},
		{"Validate index paths", map[string]any{"stream": "CDC", "tables": []any{map[string]any{"ca": "x"}, map[string]any{}}},
			[]string{path + ".tables[1].ca: must be set"}},
		{"Validate runs despite decoding errors, without repeating them", map[string]any{"ack_wait": "never", "tls": "x"},
			[]string{path + `.ack_wait: time: invalid duration "never"`, path + ".stream: must be set", path + ".tls: expected a mapping, got a string"}},
		{"every error, sorted", map[string]any{"stream": "CDC", "zz": 1, "aa": 2, "tables": []any{map[string]any{"ca": 1}}},
			[]string{
				path + ".aa: unknown key (known: ack_wait, addr, any, count, extra, headers, level, limits, pair, ratio, retries, small, stream, subjects, tables, tls, untagged, url)",
				path + ".tables[0].ca: expected a string, got an integer",
				path + ".zz: unknown key (known: ack_wait, addr, any, count, extra, headers, level, limits, pair, ratio, retries, small, stream, subjects, tables, tls, untagged, url)",
			}},
	}
	for _, tt := range errorCases {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultPlugin()
			assert.Equal(t, tt.want, problems(t, (*Config)(nil).Decoder(path, tt.raw)(&cfg)))
		})
	}

	t.Run("nil block still validates", func(t *testing.T) {
		cfg := defaultPlugin()
		err := (&Config{}).Decoder(path, nil)(&cfg)
		assert.Equal(t, []string{path + ".stream: must be set"}, problems(t, err))
	})
	t.Run("target without Validate", func(t *testing.T) {
		var target struct {
			N int `koanf:"n"`
		}
		require.NoError(t, (*Config)(nil).Decoder(path, map[string]any{"n": 3})(&target))
		assert.Equal(t, 3, target.N)
	})
	t.Run("target must be a non-nil pointer", func(t *testing.T) {
		for _, into := range []any{pluginConfig{}, (*pluginConfig)(nil), nil} {
			err := (*Config)(nil).Decoder(path, map[string]any{})(into)
			require.Error(t, err)
			var fe *FieldError
			assert.False(t, errors.As(err, &fe), "%T: %v", into, err)
			assert.True(t, strings.HasPrefix(err.Error(), "config: decoding "+path+": target must be a non-nil pointer"), err.Error())
		}
	})
}

func TestDecoderFromLoad(t *testing.T) {
	cfg, err := loadYAML(t, withBase(t, `sinks: { main: { config: { url: "${NATS_URL}", retries: "${RETRIES}" } } }`),
		environ("NATS_URL=4222", "RETRIES=3",
			"BRIDGE_SINKS__MAIN__CONFIG__STREAM=0123",
			"BRIDGE_SINKS__MAIN__CONFIG__ACK_WAIT=250ms",
			"BRIDGE_SINKS__MAIN__CONFIG__TLS__INSECURE=true",
			"BRIDGE_SINKS__MAIN__CONFIG__SMALL=12"))
	require.NoError(t, err)
	got := defaultPlugin()
	require.NoError(t, cfg.Decoder("sinks.main.config", cfg.Sinks["main"].Config)(&got))
	assert.Equal(t, "4222", got.URL, "interpolated number into a string keeps its text")
	assert.Equal(t, 3, got.Retries, "interpolated number into an int")
	assert.Equal(t, "0123", got.Stream, "env number into a string keeps its text")
	assert.Equal(t, 250*time.Millisecond, got.AckWait)
	assert.Equal(t, &tlsConfig{Insecure: true}, got.TLS)
	assert.Equal(t, int8(12), got.Small)

	t.Run("text applies only at its own path", func(t *testing.T) {
		var other pluginConfig
		err := cfg.Decoder("sinks.other.config", cfg.Sinks["main"].Config)(&other)
		assert.Contains(t, problems(t, err), "sinks.other.config.stream: expected a string, got an integer")
	})
}
