package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// usageError is a mistake in the command line (an unknown command or flag,
// a bad flag value, arguments a command does not take): exit status 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// reported is an error the command has printed itself (a configuration's
// problem list, or the log of `bridge run`): Execute does not print it
// again.
type reported struct{ error }

func (e reported) Unwrap() error { return e.error }

func isUsage(err error) bool {
	var ue usageError
	return errors.As(err, &ue)
}

// printError writes err, which cmd returned, unless the command printed it
// already: "bridge: <what>", with "see 'bridge <cmd> --help'" for usage
// errors. A multi-line error goes on indented lines.
func printError(w io.Writer, cmd *cobra.Command, err error) {
	var r reported
	if errors.As(err, &r) {
		return
	}
	msg := strings.TrimSpace(err.Error())
	if isUsage(err) {
		msg += fmt.Sprintf(" (see '%s --help')", cmd.CommandPath())
	}
	lines := strings.Split(msg, "\n")
	fmt.Fprintf(w, "bridge: %s\n", lines[0])
	for _, l := range lines[1:] {
		if l = strings.TrimSpace(l); l != "" {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
}

// unknownCommand is the usage error for name, a word that names no
// command of cmd, with the commands it resembles.
func unknownCommand(cmd *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", name, cmd.CommandPath())
	if s := cmd.SuggestionsFor(name); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", strings.Join(s, `" or "`))
	}
	return usageError{errors.New(msg)}
}

// usageArgs makes the argument checks of cmd's subcommands return usage
// errors: a word given to a command that takes none is reported as an
// unknown subcommand or argument.
func usageArgs(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		if check := c.Args; check != nil {
			c.Args = func(c *cobra.Command, args []string) error {
				if err := check(c, args); err != nil {
					if len(args) > 0 && !c.HasSubCommands() {
						return usageError{fmt.Errorf("%q takes no arguments, got %q", c.CommandPath(), strings.Join(args, " "))}
					}
					return usageError{err}
				}
				return nil
			}
		}
		usageArgs(c)
	}
}

// missingConfig is a config file that does not exist.
type missingConfig struct {
	path string
	err  error
}

func (e missingConfig) Error() string {
	return fmt.Sprintf("%s: no such file; name the config file with -c (the repository's bridge.yaml is an annotated example)", e.path)
}

func (e missingConfig) Unwrap() error { return e.err }
