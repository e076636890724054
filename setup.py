"""The one compiled part: partial JPEG decoding for fused random crops (mmloader/readers/_jpegcrop.c).

Optional: built where a C compiler and libjpeg(-turbo)'s headers are found (Debian/Ubuntu:
``libjpeg-turbo8-dev`` or ``libjpeg62-turbo-dev``); elsewhere the install goes on without it and
random crops decode the whole image, with the same pixels. Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mmloader.readers._jpegcrop",
            sources=["mmloader/readers/_jpegcrop.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
