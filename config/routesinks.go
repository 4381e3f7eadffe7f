package config

import (
	"maps"
	"slices"
)

// RouteSinks returns the names of the sinks the routes can send source's
// changes to (those of the routes whose match.sources is empty or names
// source), sorted: the sinks a pipeline of source writes to.
func (c *Config) RouteSinks(source string) []string {
	seen := map[string]bool{}
	for _, r := range c.Routes {
		if len(r.Match.Sources) > 0 && !slices.Contains(r.Match.Sources, source) {
			continue
		}
		for _, s := range r.Sinks {
			seen[s] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
