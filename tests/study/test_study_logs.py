import logging

from flatlab.study.driver_log import setup_file_logging


def test_each_study_of_a_file_logs_to_its_own_file(tmp_path):
    log = logging.getLogger("flatlab")
    setup_file_logging(tmp_path / "first")
    log.info("first study line")
    setup_file_logging(tmp_path / "second")
    log.info("second study line")
    first = (tmp_path / "first" / "logs" / "flatlab.log").read_text()
    second = (tmp_path / "second" / "logs" / "flatlab.log").read_text()
    assert "first study line" in first and "second study line" not in first
    assert "second study line" in second and "first study line" not in second
    for name in ("flatlab", "ray.tune"):
        files = [h.baseFilename for h in logging.getLogger(name).handlers if isinstance(h, logging.FileHandler)]
        assert files == [str(tmp_path / "second" / "logs" / "flatlab.log")]
