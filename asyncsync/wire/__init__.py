"""The wire: how a message becomes bytes (`frames`) and how a vector is compressed (`codecs`)."""
