package main

import (
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// logFlags are the logging flags shared by the long-running commands.
type logFlags struct {
	level  string
	format string
}

func (l *logFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
	cmd.Flags().StringVar(&l.format, "log-format", "", "log format: json or text (default: text on a terminal, json otherwise)")
}

// logger builds the command's logger writing to w.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, usageErrorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	format := strings.ToLower(l.format)
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && isTerminal(f) {
			format = "text"
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, usageErrorf("--log-format %q: want json or text", l.format)
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
