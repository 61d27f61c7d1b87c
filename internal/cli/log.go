package cli

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"time"
)

// LogFlags are --log-format and --log-level, shared by every binary.
type LogFlags struct {
	Format string
	Level  string
}

// RegisterLog adds --log-format and --log-level to fs; level is the default
// level ("off" is accepted where a binary's logs are optional).
func RegisterLog(fs *flag.FlagSet, level string) *LogFlags {
	l := &LogFlags{}
	fs.StringVar(&l.Format, "log-format", "", "log format: text or json (default: text on a terminal, json otherwise)")
	fs.StringVar(&l.Level, "log-level", level, "least severe log level: debug, info, warn or error (off: none)")
	return l
}

// Logger returns the slog.Logger the flags ask for, writing to w.
// Durations are logged as strings ("15s"), in both formats.
func (l *LogFlags) Logger(w io.Writer) (*slog.Logger, error) {
	if l.Level == "off" {
		return slog.New(slog.DiscardHandler), nil
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.Level)); err != nil {
		return nil, Usagef("--log-level %q: want debug, info, warn, error or off", l.Level)
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationString}
	format := l.Format
	if format == "" {
		format = "json"
		if IsTerminal(w) {
			format = "text"
		}
	}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, Usagef("--log-format %q: want text or json", l.Format)
}

func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// IsTerminal reports whether w is a character device (a terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Since is a duration rounded for a startup log line.
func Since(start time.Time) time.Duration {
	d := time.Since(start)
	if d > time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}
