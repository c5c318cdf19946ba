"""The data path: image datasets (zip or folder, with dataset.json labels), the real-image stream
that shares them between processes and brings them to the active resolution, and the labels of
the fakes."""
